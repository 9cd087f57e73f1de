// The inbox page: keyboard moves (j/k, Enter opens, 1-6 filter by kind, 0 all), and the list fetched
// again when the nav's socket says something changed (nav.js dispatches "inbox-changed").
(function () {
  "use strict";
  const list = document.getElementById("inbox-items");
  if (!list) return;
  let current = -1;
  function items() {
    return Array.from(list.querySelectorAll(".inbox-item"));
  }
  function focus(index) {
    const all = items();
    if (!all.length) return;
    current = Math.max(0, Math.min(index, all.length - 1));
    all.forEach((el, i) => el.classList.toggle("selected", i === current));
    all[current].focus();
  }
  document.addEventListener("keydown", (event) => {
    const tag = (event.target.tagName || "").toLowerCase();
    if (["input", "textarea", "select"].includes(tag) || event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.key === "j") focus(current + 1);
    else if (event.key === "k") focus(current - 1);
    else if (event.key === "Enter" && current >= 0) {
      const url = items()[current] && items()[current].dataset.url;
      if (url) window.location.href = url;
    } else if (/^[0-6]$/.test(event.key)) {
      const kinds = Array.from(document.querySelectorAll(".inbox-kinds li")).map((li) => li.dataset.kind);
      const params = new URLSearchParams(window.location.search);
      if (event.key === "0") params.delete("kind");
      else if (kinds[Number(event.key) - 1]) params.set("kind", kinds[Number(event.key) - 1]);
      window.location.search = params.toString();
    } else return;
    event.preventDefault();
  });
  document.body.addEventListener("inbox-changed", () => {
    if (!window.htmx) return;
    window.htmx.ajax("GET", window.location.pathname + window.location.search, { target: list, swap: "innerHTML" });
  });
})();

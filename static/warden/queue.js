// The reviewer queue: countdowns to expiry, the newest request id for polling, keyboard shortcuts.
function wardenNewest() {
  let newest = 0;
  document.querySelectorAll("#queue [data-request]").forEach((card) => {
    newest = Math.max(newest, Number(card.dataset.request));
  });
  return newest;
}

function wardenTick() {
  const now = Date.now();
  document.querySelectorAll(".countdown[data-expires]").forEach((el) => {
    const left = Math.max(0, Math.round((Date.parse(el.dataset.expires) - now) / 1000));
    const m = Math.floor(left / 60), s = left % 60;
    el.textContent = left ? `expires in ${m}m ${String(s).padStart(2, "0")}s` : "expired";
  });
  const empty = document.getElementById("empty");
  if (empty) empty.hidden = document.querySelectorAll("#queue .card.pending").length > 0;
}

function wardenCards() {
  return Array.from(document.querySelectorAll("#queue .card.pending"));
}

document.addEventListener("keydown", (event) => {
  if (event.target.matches("input, textarea") || event.metaKey || event.ctrlKey || event.altKey) return;
  const cards = wardenCards();
  if (!cards.length) return;
  const current = cards.indexOf(document.activeElement.closest && document.activeElement.closest(".card"));
  if (event.key === "j" || event.key === "k") {
    const next = event.key === "j" ? Math.min(cards.length - 1, current + 1) : Math.max(0, current - 1);
    cards[next].focus();
    event.preventDefault();
    return;
  }
  const card = current >= 0 ? cards[current] : null;
  if (!card) return;
  if (event.key === "a") card.querySelector("button.approve")?.click();
  if (event.key === "r") {
    const note = card.querySelector("input[name=note]");
    if (note && note.value.trim()) card.querySelector("button.reject")?.click();
    else note?.focus();
  }
  if (event.key === "e") {
    const edit = card.querySelector("details.edit");
    if (edit) { edit.open = true; edit.querySelector("textarea").focus(); }
  }
  event.preventDefault();
});

// The poll asks only for requests newer than the newest card (no hx-vals "js:": htmx runs without eval).
document.addEventListener("htmx:configRequest", (event) => {
  if (event.detail.elt.id === "queue") event.detail.parameters.after = wardenNewest();
});

setInterval(wardenTick, 1000);
document.addEventListener("DOMContentLoaded", wardenTick);
document.addEventListener("htmx:afterSwap", wardenTick);

// The nav's "Needs you" count, kept current over a websocket (docs/dashboard.md, "Needs you").
//
// The socket (/ws/inbox/) only says that something in one of the user's projects changed; the count
// itself is fetched again from the server (htmx, the "inbox-changed" event), a second after the last
// nudge, so a burst of changes costs one request. Without the socket the count is fetched every minute.
(function () {
  "use strict";
  if (!window.WebSocket) return;
  let delay = 1000;
  let timer = null;
  function changed() {
    if (timer) return;
    timer = setTimeout(() => {
      timer = null;
      document.body.dispatchEvent(new CustomEvent("inbox-changed"));
    }, 1000);
  }
  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + location.host + "/ws/inbox/");
    socket.onopen = () => {
      delay = 1000;
    };
    socket.onmessage = changed;
    socket.onclose = (event) => {
      if (event.code === 4403) return; // refused: not logged in any more
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 30000);
    };
  }
  connect();
})();

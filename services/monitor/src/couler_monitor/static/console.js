// Couler console: live updates without reloads. Served by the monitor itself (the page's
// Content-Security-Policy allows scripts from it only). An element with data-live holds a
// server-rendered fragment; the server sends a new rendering over server-sent events
// (EventSource on the same origin, with the session cookie) when it changed, and it
// replaces the old one. The HTML is the server's (escaped there); nothing is built here.
"use strict";
(function () {
  function follow(el) {
    var source = new EventSource(el.getAttribute("data-live"));
    var updates = 0;
    source.addEventListener("fragment", function (event) {
      // keep which <details> are open across the swap
      el.innerHTML = event.data;
      updates += 1;
      el.setAttribute("data-updates", String(updates));
    });
    source.addEventListener("gone", function () { source.close(); });
    source.onerror = function () {
      el.setAttribute("data-stream", "reconnecting");
    };
    source.onopen = function () {
      el.setAttribute("data-stream", "open");
    };
  }
  function confirmActions() {
    var forms = document.querySelectorAll("section.actions form");
    Array.prototype.forEach.call(forms, function (form) {
      form.addEventListener("submit", function (event) {
        var button = form.querySelector("button");
        var what = button ? button.textContent : "this";
        if (!window.confirm(what + "?")) { event.preventDefault(); }
      });
    });
  }
  function start() {
    Array.prototype.forEach.call(document.querySelectorAll("[data-live]"), follow);
    confirmActions();
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();

// The job list's filter menus, and a running job's live progress on its page.
// Loaded in the page's head (the admin's media), so it starts once the page is parsed,
// after the admin's own filters.js has restored which filters were open.
(function () {
  "use strict";

  // The filters sit in a row of menus above the list (jobs.css): each opens on
  // a click, closes when another opens or on a click elsewhere, and names the
  // value it filters by, so the row reads as the filters in force. A menu is
  // opened by a class, not by its <details> element's open state, which the
  // admin's filters.js remembers for every list with a filter of that title.
  function menus() {
    var box = document.querySelector("body.model-job.change-list #changelist-filter");
    if (!box) {
      return;
    }
    var filters = box.querySelectorAll("details");
    box.classList.add("vellum-menus");
    function close(except) {
      filters.forEach(function (menu) {
        if (menu !== except) {
          menu.classList.remove("vellum-open");
        }
      });
    }
    filters.forEach(function (menu) {
      menu.setAttribute("open", "");
      var chosen = menu.querySelector("li.selected a");
      var summary = menu.querySelector("summary");
      if (!summary) {
        return;
      }
      if (chosen && menu.querySelector("li") !== chosen.parentNode) {
        summary.textContent = summary.textContent.replace(/\s+$/, "");
        var label = document.createElement("span");
        label.className = "vellum-chosen";
        label.textContent = ": " + chosen.textContent.trim();
        summary.appendChild(label);
      }
      summary.addEventListener("click", function (event) {
        event.preventDefault();
        close(menu);
        menu.classList.toggle("vellum-open");
      });
    });
    document.addEventListener("click", function (event) {
      if (!box.contains(event.target)) {
        close(null);
      }
    });
    document.addEventListener("keydown", function (event) {
      if (event.key === "Escape") {
        close(null);
      }
    });
  }

  function show(id, text) {
    var element = document.getElementById(id);
    if (element) {
      element.textContent = text;
    }
  }

  // A running job's progress, asked for every few seconds; the page is not reloaded.
  // Once the job has stopped running the polls stop, and the page says to reload it.
  function progress() {
    var live = document.getElementById("vellum-live");
    if (!live) {
      return;
    }
    var every = 1000 * (parseInt(live.dataset.every, 10) || 3);
    function poll() {
      fetch(live.dataset.url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (response) {
          if (!response.ok && response.status !== 404) {
            throw new Error("status " + response.status);
          }
          return response.json();
        })
        .then(function (figures) {
          live.classList.remove("vellum-stale");
          live.dataset.polls = String((parseInt(live.dataset.polls, 10) || 0) + 1);
          if (!figures.running) {
            var now = figures.gone ? "deleted" : figures.state;
            show("vellum-live-status", "This job is " + now + " now: reload the page to see how it ended.");
            live.dataset.finished = now;
            return;
          }
          var bar = document.getElementById("vellum-live-bar");
          if (bar && figures.total) {
            bar.max = figures.total;
            bar.value = Math.min(figures.done || 0, figures.total);
          }
          show("vellum-live-text", figures.text);
          show("vellum-live-rate", figures.rate_text);
          show("vellum-live-remaining", figures.remaining_text);
          show("vellum-live-message", figures.message);
          var asked = figures.stop_requested ? "Asked to stop; waiting for its handler. " : "";
          show("vellum-live-status", asked + "Updated " + new Date().toLocaleTimeString() + ".");
          window.setTimeout(poll, every);
        })
        .catch(function () {
          live.classList.add("vellum-stale"); // the last figures stay, marked as old
          window.setTimeout(poll, every);
        });
    }
    window.setTimeout(poll, every);
  }

  function start() {
    menus();
    progress();
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();

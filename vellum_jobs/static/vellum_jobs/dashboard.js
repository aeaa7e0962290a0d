// The dashboard asks for its figures again every few seconds and swaps them
// in, so the page stays where it is scrolled and nothing reloads. Without
// script, a <noscript> meta refresh reloads the page instead.
(function () {
  "use strict";
  var box = document.getElementById("vellum-dashboard");
  if (!box) {
    return;
  }
  var every = 1000 * (parseInt(box.dataset.refresh, 10) || 5);
  function refresh() {
    fetch(box.dataset.url, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("status " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        box.innerHTML = html;
        box.classList.remove("vellum-stale-figures");
      })
      .catch(function () {
        box.classList.add("vellum-stale-figures");  // the last figures stay, marked as old
      })
      .finally(function () {
        window.setTimeout(refresh, every);
      });
  }
  window.setTimeout(refresh, every);
})();

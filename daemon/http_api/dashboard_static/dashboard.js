// suffixd dashboard: refresh the panel in place, switch namespace or range on a choice.
// The charts are drawn by the server (daemon/http_api/dashboard_svg.py); this script
// only fetches /dashboard/panel with the page's query every data-refresh seconds.
(function () {
  "use strict";
  var body = document.body;
  var every = Math.max(1, Number(body.getAttribute("data-refresh")) || 5) * 1000;
  var panel = document.getElementById("panel");
  var status = document.getElementById("status");
  var form = document.getElementById("pick");

  function stamp(text, bad) {
    status.textContent = text;
    status.className = bad ? "bad" : "";
  }

  function refresh() {
    fetch("/dashboard/panel" + location.search, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.text();
      })
      .then(function (html) {
        panel.innerHTML = html;
        stamp("updated " + new Date().toLocaleTimeString() + ", every " + every / 1000 + " s", false);
      })
      .catch(function (e) { stamp("daemon unreachable (" + e.message + "), retrying", true); })
      .finally(function () { setTimeout(refresh, every); });
  }

  form.addEventListener("change", function () { form.submit(); });
  stamp("updated " + new Date().toLocaleTimeString() + ", every " + every / 1000 + " s", false);
  setTimeout(refresh, every);
})();

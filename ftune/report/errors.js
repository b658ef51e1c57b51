// Runs first: every script error and console.error lands in #js-errors and body[data-errors] (read by the tests).
(function () {
  var seen = [];
  function record(text) {
    seen.push(String(text));
    var show = function () {
      var pre = document.getElementById("js-errors");
      if (pre) { pre.textContent = seen.join("\n"); }
      if (document.body) { document.body.setAttribute("data-errors", String(seen.length)); }
    };
    if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", show); } else { show(); }
  }
  window.onerror = function (message, source, line, column) { record(message + " (line " + line + ":" + column + ")"); };
  window.addEventListener("unhandledrejection", function (e) { record("unhandled rejection: " + e.reason); });
  var original = console.error;
  console.error = function () {
    record(Array.prototype.join.call(arguments, " "));
    return original.apply(console, arguments);
  };
})();

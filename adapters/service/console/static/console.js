// ENS console: the little the pages need beyond htmx (no inline scripts: the CSP forbids them).
"use strict";
document.addEventListener("keydown", function (e) {
  // "/" jumps to the page's filter or editor, as in most consoles
  if (e.key === "/" && !/^(INPUT|TEXTAREA|SELECT)$/.test(document.activeElement.tagName)) {
    var f = document.querySelector("[data-slash]");
    if (f) { e.preventDefault(); f.focus(); }
  }
});
document.addEventListener("htmx:afterSettle", function (e) {
  // after an action, say what happened where a keyboard or screen-reader user is (the
  // alarms' message comes out of band, into #notice, so that live refreshes keep it)
  var notice = document.querySelector("#notice .notice") ||
    (e.target.querySelector && e.target.querySelector(".notice, .error"));
  // (not while typing: the editor's as-you-type check must leave the caret where it is)
  var from = e.detail.requestConfig && e.detail.requestConfig.elt;
  if (notice && e.detail.requestConfig.verb === "post" && from && from.tagName !== "TEXTAREA") {
    notice.setAttribute("tabindex", "-1");
    notice.focus();
  }
});
document.addEventListener("click", function (e) {
  // a problem's "line N" puts the editor's caret at the start of that line
  var b = e.target.closest && e.target.closest("[data-goto-line]");
  if (!b) return;
  var ta = document.getElementById("text");
  var n = parseInt(b.getAttribute("data-goto-line"), 10);
  var lines = ta.value.split("\n");
  var pos = 0;
  for (var i = 0; i < n - 1 && i < lines.length; i++) pos += lines[i].length + 1;
  ta.focus();
  ta.setSelectionRange(pos, pos + (lines[n - 1] || "").length);
});

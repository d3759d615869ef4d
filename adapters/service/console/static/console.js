// ENS console: the little the pages need beyond htmx (no inline scripts: the CSP forbids them).
"use strict";
document.addEventListener("keydown", function (e) {
  // "/" jumps to the page's filter or editor, as in most consoles
  if (e.key === "/" && !/^(INPUT|TEXTAREA|SELECT)$/.test(document.activeElement.tagName)) {
    var f = document.querySelector("[data-slash]");
    if (f) { e.preventDefault(); f.focus(); }
  }
});
document.addEventListener("htmx:afterSwap", function (e) {
  // after an action, say what happened where a keyboard or screen-reader user is
  var notice = e.target.querySelector && e.target.querySelector(".notice, .error");
  if (notice && e.detail.requestConfig && e.detail.requestConfig.verb === "post") {
    notice.setAttribute("tabindex", "-1");
    notice.focus();
  }
});

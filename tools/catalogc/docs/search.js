(function () {
  "use strict";
  var box = document.getElementById("search");
  var count = document.getElementById("search-count");
  var items = Array.prototype.slice.call(document.querySelectorAll("article[data-method]"));
  var links = Array.prototype.slice.call(document.querySelectorAll("nav li[data-method]"));
  function apply(q) {
    q = q.trim().toLowerCase();
    var shown = 0;
    items.forEach(function (a) {
      var hit = q === "" || a.getAttribute("data-search").indexOf(q) >= 0;
      a.hidden = !hit;
      if (hit) { shown++; }
    });
    links.forEach(function (l) {
      var a = document.getElementById(l.getAttribute("data-method"));
      l.hidden = a ? a.hidden : false;
    });
    count.textContent = q === "" ? "" : shown + " of " + items.length + " methods";
  }
  box.addEventListener("input", function () { apply(box.value); });
  var q = new URLSearchParams(window.location.search).get("q");
  if (q) { box.value = q; }
  apply(box.value);
})();

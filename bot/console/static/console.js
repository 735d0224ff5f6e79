// vaultmail console: a little progressive JavaScript. Without it every page works by plain
// links and forms; with it, new items arrive without a reload (server-sent events) and the
// badge follows them.
(function () {
  "use strict";
  var stream = document.body.getAttribute("data-live");
  if (!stream || !window.EventSource) { return; }
  var note = document.getElementById("live-note");

  function busy(region) {
    // someone is typing in it: do not pull it from under them
    var fields = region.querySelectorAll("textarea, input[type=text], input:not([type])");
    for (var i = 0; i < fields.length; i++) {
      if (fields[i].value && fields[i].value.trim() !== "") { return true; }
    }
    return region.contains(document.activeElement) &&
      /^(TEXTAREA|INPUT|SELECT)$/.test(document.activeElement.tagName);
  }

  function refresh(region, version) {
    if (busy(region)) {
      var offer = region.previousElementSibling;
      if (!offer || !offer.classList || !offer.classList.contains("new-items")) {
        offer = document.createElement("p");
        offer.className = "new-items";
        var button = document.createElement("button");
        button.type = "button";
        button.textContent = "New items: show them";
        button.addEventListener("click", function () {
          offer.remove();
          load(region, version, true);
        });
        offer.appendChild(button);
        region.parentNode.insertBefore(offer, region);
      }
      return;
    }
    load(region, version, false);
  }

  function load(region, version, focus) {
    fetch(region.getAttribute("data-src"), {credentials: "same-origin",
                                            headers: {"X-Requested-With": "fetch"}})
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        region.innerHTML = html;
        region.setAttribute("data-version", version);
        if (note) { note.textContent = "Updated with new items."; }
        if (focus) {
          var first = region.querySelector("h2, h3");
          if (first) { first.setAttribute("tabindex", "-1"); first.focus(); }
        }
      })
      .catch(function () { /* the next event tries again */ });
  }

  function badge(count) {
    var el = document.getElementById("badge");
    if (!el) { return; }
    el.textContent = String(count);
    el.setAttribute("data-count", String(count));
    el.setAttribute("aria-label", count + " for you");
    el.hidden = count === 0;
  }

  var source = new EventSource(stream);
  source.addEventListener("change", function (event) {
    var data = JSON.parse(event.data);
    badge(data.badge);
    var regions = document.querySelectorAll("[data-src][data-version]");
    for (var i = 0; i < regions.length; i++) {
      if (regions[i].getAttribute("data-version") !== data.version) {
        refresh(regions[i], data.version);
      }
    }
    document.body.setAttribute("data-stream", "open");
  });
}());

// vaultmail console: a little progressive JavaScript. Without it every page works by plain
// links and forms; with it, new items arrive without a reload (server-sent events) and the
// badge follows them.
(function () {
  "use strict";
  var stream = document.body.getAttribute("data-live");
  if (!stream || !window.fetch || !window.TextDecoder) { return; }
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

  // The stream, read with fetch rather than EventSource: EventSource gives up for good after
  // a 429 or any other error status and cannot read Retry-After. Here any end of the stream
  // (the app restarted, a proxy cut it, the person's cap was full) is followed by another try,
  // after Retry-After when the answer has one, else with a backoff doubling from a second to
  // half a minute; meanwhile the page says it is reconnecting. A 401 or 403 (signed out, no
  // longer one of the office's people) ends it: a reload leads to the sign-in.
  var state = document.getElementById("live-state");
  var failures = 0;
  var FIRST_WAIT = 1000;  // ms before the first try again, doubled at each failure
  var aborter = null;
  var leaving = false;

  function show(mode, text) {
    document.body.setAttribute("data-stream", mode);
    if (!state) { return; }
    state.textContent = text || "";
    state.hidden = !text;
  }

  function changed(data) {
    badge(data.badge);
    var regions = document.querySelectorAll("[data-src][data-version]");
    for (var i = 0; i < regions.length; i++) {
      if (regions[i].getAttribute("data-version") !== data.version) {
        refresh(regions[i], data.version);
      }
    }
    failures = 0;
    show("open", "");
  }

  function dispatch(block) {
    var name = "message";
    var data = [];
    var lines = block.split("\n");
    for (var i = 0; i < lines.length; i++) {
      var line = lines[i];
      if (line === "" || line.charAt(0) === ":") { continue; }
      var colon = line.indexOf(":");
      var field = colon < 0 ? line : line.slice(0, colon);
      var value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "event") { name = value; }
      else if (field === "data") { data.push(value); }
    }
    if (name === "change" && data.length) { changed(JSON.parse(data.join("\n"))); }
  }

  function again(seconds) {
    if (leaving) { return; }
    failures += 1;
    var wait = Math.min(30000, FIRST_WAIT * Math.pow(2, failures - 1));
    if (seconds !== null) { wait = Math.max(wait, seconds * 1000); }
    wait += Math.floor(Math.random() * 250);  // not every page of the office at once
    show("reconnecting", "Live updates interrupted: reconnecting…");
    window.setTimeout(connect, wait);
  }

  function retryAfter(response) {
    var value = response.headers.get("Retry-After");
    if (value && /^\d+$/.test(value.trim())) { return parseInt(value, 10); }
    var when = value ? Date.parse(value) : NaN;
    return isNaN(when) ? null : Math.max(0, (when - Date.now()) / 1000);
  }

  function read(reader) {
    var decoder = new TextDecoder();
    var buffer = "";
    function next() {
      return reader.read().then(function (chunk) {
        if (chunk.done) { return; }
        buffer += decoder.decode(chunk.value, {stream: true});  // the app ends lines with \n
        var end = buffer.indexOf("\n\n");
        while (end >= 0) {
          dispatch(buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
          end = buffer.indexOf("\n\n");
        }
        return next();
      });
    }
    return next();
  }

  function connect() {
    if (leaving) { return; }
    aborter = window.AbortController ? new AbortController() : null;
    fetch(stream, {credentials: "same-origin", cache: "no-store",
                   headers: {"Accept": "text/event-stream"},
                   signal: aborter ? aborter.signal : undefined})
      .then(function (response) {
        if (response.status === 401 || response.status === 403) {
          show("closed", "Live updates stopped: reload the page to sign in again.");
          return;
        }
        if (!response.ok || !response.body) {
          again(retryAfter(response));
          return;
        }
        return read(response.body.getReader()).then(function () { again(null); });
      })
      .catch(function () { again(null); });
  }

  window.addEventListener("pagehide", function () {
    leaving = true;  // the stream is let go now, not when the server next looks
    if (aborter) { aborter.abort(); }
  });
  window.addEventListener("pageshow", function (event) {
    if (event.persisted && leaving) { leaving = false; failures = 0; connect(); }
  });
  connect();
}());

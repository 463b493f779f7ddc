// What both pages (docs/web.md) share: the gateway's API with the login's cookie, and the level
// meters. Loaded before each page's own script, as window.AppBridge.
"use strict";

window.AppBridge = (() => {
  const SILENT_DBFS = -100;

  // Every request carries the session cookie; a 401 means the login lapsed, and reloading shows
  // the gateway's login form. Reload once: a second 401 soon after means this route refuses
  // what the page was allowed with, and reloading again would loop.
  async function api(path, options = {}) {
    const res = await fetch(path, { credentials: "same-origin", ...options });
    if (res.status === 401) {
      const last = Number(sessionStorage.getItem("appbridge-reloaded") || 0);
      if (Date.now() - last > 30000) {
        sessionStorage.setItem("appbridge-reloaded", String(Date.now()));
        window.location.reload();
      }
      throw new Error(`unauthorized (${path})`);
    }
    return res;
  }

  // A meter and its label at ``dbfs``, clamped to [-100, 0]; anything not a number is silence.
  function showLevel(meter, dbfs) {
    const number = Number(dbfs);
    const value = Number.isFinite(number)
      ? Math.round(Math.max(SILENT_DBFS, Math.min(0, number)) * 10) / 10
      : SILENT_DBFS;
    meter.value = value;
    meter.dataset.dbfs = String(value);
    const label = document.querySelector(`.dbfs[data-for="${meter.id}"]`);
    if (label) label.textContent = `${value.toFixed(0)} dBFS`;
  }

  return { api, showLevel, SILENT_DBFS };
})();

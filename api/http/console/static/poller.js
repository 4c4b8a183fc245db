// Polling at a modest rate, paused while the tab is hidden; a refused token stops it for good.

import {AuthError} from "./api.js";

const active = new Set();

document.addEventListener("visibilitychange", () => {
  for (const poller of active) {
    if (document.hidden) poller.pause();
    else poller.resume();
  }
});

export class Poller {
  // tick: an async function; onAuthError(err): what the page does when the token is refused.
  constructor(tick, onAuthError, intervalMs = 3000) {
    this.tick = tick;
    this.onAuthError = onAuthError;
    this.intervalMs = intervalMs;
    this.timer = null;
    this.stopped = false;
    this.running = false;
  }

  start() {
    active.add(this);
    this.run();
    return this;
  }

  async run() {
    this.timer = null;
    if (this.stopped || document.hidden || this.running) return;
    this.running = true;
    try {
      await this.tick();
    } catch (err) {
      if (err instanceof AuthError) {
        this.stop();
        this.onAuthError(err);
        return;
      }
      console.warn("poll failed:", err.message);
    } finally {
      this.running = false;
    }
    if (!this.stopped && !document.hidden) this.timer = setTimeout(() => this.run(), this.intervalMs);
  }

  pause() {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
  }

  resume() {
    if (!this.stopped && this.timer === null) this.run();
  }

  stop() {
    this.stopped = true;
    this.pause();
    active.delete(this);
  }
}

export function stopAll() {
  for (const poller of [...active]) poller.stop();
}

"""Rank 0 of a program watches its checkpoint directory: each new complete checkpoint becomes a
checkpoint event (the supervisor's straggler `replace` and preemption act at durable
checkpoints), and only the newest `checkpoint.keep` are kept."""

from __future__ import annotations

import threading
from collections.abc import Callable

from trainyard.checkpoints import complete_checkpoints_in
from workers.events import RankCheckpoint, RankEvent
from workers.storage import Storage


class CheckpointWatch:
    def __init__(self, directory: Storage, keep: int, emit: Callable[[RankEvent], None], interval_s: float = 0.5):
        self.directory, self.keep, self.emit, self.interval_s = directory, keep, emit, interval_s
        done = complete_checkpoints_in(directory.uri)
        self.newest = done[-1][0] if done else None  # those of an earlier attempt are not news
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="checkpoint-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(self.interval_s):
            self.scan()

    def scan(self) -> None:
        done = complete_checkpoints_in(self.directory.uri)
        if done and (self.newest is None or done[-1][0] > self.newest):
            self.newest = done[-1][0]
            self.emit(RankCheckpoint(0, self.newest, None))
        for _, path in done[:-self.keep]:
            self.directory.remove(Storage.at(path).name)  # a file or a whole directory

    def close(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)
        self.scan()  # a checkpoint written just before the program exited

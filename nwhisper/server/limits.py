"""Who is served at once: a fixed number of slots, a bounded first-come-first-served wait.

    slots = Slots(8, max_waiting=16)
    ticket = slots.enter()         # raises Busy when 16 are already waiting
    if await ticket:               # True: the slot is ours; False: we left the queue
        ...
        slots.release()
    slots.leave(ticket)            # the client went away while waiting

A slot is held by a request from the moment its headers are read until its answer is written
(its body is read only once it has a slot, so waiting clients cost headers, not uploads), and
by a WebSocket stream for as long as it is open. An idle keep-alive connection holds nothing.
Releasing hands the slot straight to the longest waiter, so nobody can overtake the queue.
"""

from __future__ import annotations

import collections

from tornado.concurrent import Future


class Busy(Exception):
    """Every slot is taken and the wait queue is full."""


class Slots:
    def __init__(self, size, max_waiting):
        self.size, self.max_waiting = int(size), int(max_waiting)
        self.active = 0
        self._waiters = collections.deque()

    @property
    def waiting(self):
        return len(self._waiters)

    def enter(self):
        """A future that resolves True once the caller holds a slot (at once if one is free)."""
        f = Future()
        if self.active < self.size and not self._waiters:
            self.active += 1
            f.set_result(True)
        elif len(self._waiters) >= self.max_waiting:
            raise Busy(f"server busy: {self.active} requests in progress and {len(self._waiters)} "
                       f"waiting, the most this server queues; retry later")
        else:
            self._waiters.append(f)
        return f

    def enter_now(self):
        """A slot now, or Busy: a live stream does not wait behind streams that may stay open."""
        f = self.enter()
        if not f.done():
            self.leave(f)
            raise Busy(f"server busy: all {self.size} connections are in use; retry later")
        return f

    def leave(self, f):
        """Give up a ticket: leave the queue, or hand the slot on if it was already ours."""
        if not f.done():
            self._waiters.remove(f)
            f.set_result(False)
        elif f.result():
            self.release()

    def release(self):
        if self._waiters:
            self._waiters.popleft().set_result(True)   # the slot passes on; active stays
        else:
            self.active -= 1

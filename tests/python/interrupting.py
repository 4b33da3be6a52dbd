"""A stand-in for a client's socket that interrupts it at a chosen byte: the deterministic way to
land a KeyboardInterrupt (or any exception) in the middle of a frame, which a signal timer only
hits by chance.

    c._sock = InterruptingSocket(c._sock, send_after=1000)   # the 1001st byte sent raises

send_after / recv_after: bytes let through that way before the interruption (0: the first
call raises with nothing moved). lose: for recv, the interruption lands after the bytes left the
kernel and before the caller got them (a signal handler run as recv returns): they are gone.
The interruption fires once; after it the socket passes everything through.
"""

import os


class InterruptingSocket:
    def __init__(self, sock, *, send_after=None, recv_after=None, error=KeyboardInterrupt,
                 lose=0, timeout=None):
        self._sock = sock
        self.send_after = send_after
        self.recv_after = recv_after
        self.error = error
        self.lose = lose
        self.sent = 0
        self.received = 0
        self.fired = False
        if timeout is not None:  # a client left waiting on a poisoned stream fails, not hangs
            sock.settimeout(timeout)

    def _fire(self):
        self.fired = True
        raise self.error() if isinstance(self.error, type) else self.error

    def _room(self, after, moved):
        if self.fired or after is None:
            return None
        if moved >= after:
            self._fire()
        return after - moved

    def send(self, data, *flags):
        room = self._room(self.send_after, self.sent)
        view = memoryview(data)
        n = self._sock.send(view if room is None else view[:room], *flags)
        self.sent += n
        return n

    def sendall(self, data, *flags):
        view = memoryview(data)
        while view:
            view = view[self.send(view, *flags):]

    def sendmsg(self, buffers, ancillary=(), flags=0, *rest):
        room = self._room(self.send_after, self.sent)
        view = memoryview(b"".join(bytes(b) for b in buffers))
        n = self._sock.sendmsg([view if room is None else view[:room]], ancillary, flags, *rest)
        self.sent += n
        return n

    def recv(self, size, *flags):
        room = None
        if not self.fired and self.recv_after is not None:
            room = self.recv_after - self.received
            if room <= 0:
                if self.lose:
                    # Consumed from the kernel, then the interruption: these bytes reach no one.
                    self.received += len(self._sock.recv(self.lose, *flags))
                self._fire()
        data = self._sock.recv(size if room is None else min(size, room), *flags)
        self.received += len(data)
        return data

    def __getattr__(self, name):
        return getattr(self._sock, name)


def memfd_inodes(pid, name="warmpool-client-region"):
    """Inodes of the memfds named name that process pid holds open."""
    found = set()
    base = f"/proc/{pid}/fd"
    for entry in os.listdir(base):
        try:
            target = os.readlink(os.path.join(base, entry))
            if target.startswith(f"/memfd:{name}"):
                found.add(os.stat(os.path.join(base, entry)).st_ino)
        except OSError:
            pass
    return found


__all__ = ["InterruptingSocket", "memfd_inodes"]

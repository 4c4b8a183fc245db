"""A TCP forwarder that a test closes and reopens: a server (MLflow, the S3 store) going away and
coming back, to the client, without losing what the server holds."""

from __future__ import annotations

import socket
import threading


class TcpForward:
    """127.0.0.1:<port> -> target port, byte for byte. close() refuses new connections and cuts open
    ones: to a client it is a tracking server that went down."""

    def __init__(self, target_port: int, listen_port: int = 0):
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", listen_port))
        self.port = self._listener.getsockname()[1]
        self.uri = f"http://127.0.0.1:{self.port}"
        self._open: list[socket.socket] = []
        self._held: socket.socket | None = None
        threading.Thread(target=self._accept, daemon=True).start()

    def go_down(self) -> None:
        """close(), but keep the port bound and not listening: clients are refused as by a server that is
        gone, and no other process's connection can take the port before come_back() (a busy host
        hands out freed ports as ephemeral ones within seconds)."""
        self.close()
        self._held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._held.bind(("127.0.0.1", self.port))

    def come_back(self) -> None:
        """Listen again on the port held since go_down()."""
        assert self._held is not None, "come_back() without go_down()"
        self._held.listen()
        self._listener, self._held, self._open = self._held, None, []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        # shutdown() first: a plain close() leaves the socket listening while accept() blocks on it.
        for s in (self._listener, *self._open):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

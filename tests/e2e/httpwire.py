"""A raw HTTP/1.1 client over one socket, for tests of the wire itself:
keep-alive reuse, pipelining, chunked framing, half-closes. It parses what
the server sends byte for byte (status line, header, a Content-Length or
chunked body) and never hides a hang: every read has a deadline."""
import json
import socket
import time


class Hung(Exception):
    """The server sent nothing (more) before the deadline."""


class Conn:
    def __init__(self, port, host="127.0.0.1", timeout=10.0):
        self.s = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""
        self.timeout = timeout
        self.chunk_trailer_ok = None  # did the last chunked reply end with its 0-size chunk

    def send(self, data):
        self.s.sendall(data)

    def close(self):
        try:
            self.s.close()
        except OSError:
            pass

    def _fill(self, deadline):
        left = deadline - time.monotonic()
        if left <= 0:
            raise Hung("no answer within %.1f s" % self.timeout)
        self.s.settimeout(left)
        try:
            b = self.s.recv(65536)
        except socket.timeout:
            raise Hung("no answer within %.1f s" % self.timeout) from None
        if not b:
            raise EOFError("the server closed the connection")
        self.buf += b

    def _line(self, deadline):
        while b"\r\n" not in self.buf:
            self._fill(deadline)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _take(self, n, deadline):
        while len(self.buf) < n:
            self._fill(deadline)
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def response(self, head_only=False, timeout=None):
        """(status, headers dict with lower-case names, body bytes) of the next response."""
        deadline = time.monotonic() + (timeout or self.timeout)
        line = self._line(deadline)
        while line == b"":  # tolerate nothing: a stray CRLF before a status line is a server bug
            raise AssertionError("empty line before a status line")
        parts = line.split(b" ", 2)
        status = int(parts[1])
        h = {}
        while True:
            line = self._line(deadline)
            if not line:
                break
            k, v = line.split(b":", 1)
            h[k.decode().strip().lower()] = v.decode().strip()
        if status == 100:
            return self.response(head_only, timeout)
        if head_only or status in (204, 304):
            return status, h, b""
        if h.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self._line(deadline).split(b";")[0], 16)
                if size == 0:
                    while self._line(deadline):  # trailers, then the empty line
                        pass
                    break
                body += self._take(size, deadline)
                if self._take(2, deadline) != b"\r\n":
                    raise AssertionError("chunk data not followed by CRLF")
            return status, h, body
        if "content-length" in h:
            return status, h, self._take(int(h["content-length"]), deadline)
        # no length: the body runs to the close
        while True:
            try:
                self._fill(deadline)
            except EOFError:
                break
        body, self.buf = self.buf, b""
        return status, h, body

    def wait_for(self, marker, timeout=None):
        """Reads until marker has arrived, consuming nothing."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while marker not in self.buf:
            self._fill(deadline)

    def closed_within(self, secs):
        """True when the server closes the connection (EOF) within secs, reading past anything it sends."""
        deadline = time.monotonic() + secs
        self.buf = b""
        while True:
            try:
                self._fill(deadline)
                self.buf = b""
            except EOFError:
                return True
            except (Hung, ConnectionResetError):
                return False


def request(method, path, body=None, headers=None, key=None):
    h = {"Host": "x"}
    if key:
        h["Authorization"] = "Bearer " + key
    if body is not None:
        if not isinstance(body, bytes):
            body = json.dumps(body).encode()
        h["Content-Type"] = "application/json"
        h["Content-Length"] = str(len(body))
    h.update(headers or {})
    head = "%s %s HTTP/1.1\r\n" % (method, path) + "".join("%s: %s\r\n" % kv for kv in h.items()) + "\r\n"
    return head.encode() + (body or b"")


def sse_events(body):
    """The data: payloads of an SSE body, in order."""
    return [ln[6:] for ln in body.decode().split("\n") if ln.startswith("data: ")]

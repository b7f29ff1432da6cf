#!/usr/bin/env python3
"""The five-minute tour's stand-in for your application.

Python's file server, serving the files of this directory (docs/tour) and
nothing else, with one more path: /slow?s=SECONDS answers "slept SECONDS s"
after that many seconds. It listens on 127.0.0.1 and logs nothing.

Usage: python3 docs/tour/app.py PORT
"""
import functools
import os
import sys
import time
import urllib.parse
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))


class Handler(SimpleHTTPRequestHandler):
    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path != "/slow":
            return super().do_GET()
        seconds = float(urllib.parse.parse_qs(url.query).get("s", ["1"])[0])
        time.sleep(seconds)
        body = f"slept {seconds:g} s\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):
        pass  # the tour's terminal stays readable


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 docs/tour/app.py PORT")
    handler = functools.partial(Handler, directory=HERE)
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), handler).serve_forever()

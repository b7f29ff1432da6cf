#!/usr/bin/env python3
"""The five-minute tour's stand-in for your application.

Python's file server (it serves the current directory) with one more path:
/slow?s=SECONDS answers "slept SECONDS s" after that many seconds.

Usage: python3 docs/tour/app.py [PORT]   (default 8000, on 127.0.0.1)
"""
import sys
import time
import urllib.parse
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer


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


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()

"""Runs the SDK's tests against a live, ephemeral molt daemon.

    python3 sdk/python/tests/live.py --molt bin/molt

Compiles the package, installs it with pip (no index) into a temporary
directory, starts `molt daemon` on a temporary root with a loop pool,
builds the debian image (from the debootstrap cache, /var/cache/molt,
after the first build), runs the unittest suite of this directory with
MOLT_SOCKET set and the installed package first on the path, then removes
every sandbox, stops the daemon, unmounts the pool and checks that no
loop device still holds it. Needs root; without it the run is skipped,
unless MOLT_REQUIRE_PRIVILEGED=1, where it fails.
"""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)


def log(msg):
    print(f"test-python: {msg}", file=sys.stderr, flush=True)


def tail(path, n=4000):
    try:
        with open(path, "rb") as f:
            return f.read()[-n:].decode("utf-8", "replace")
    except OSError:
        return ""


def mounted(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def loop_holding(backing):
    base = "/sys/block"
    for dev in os.listdir(base):
        p = os.path.join(base, dev, "loop", "backing_file")
        try:
            with open(p) as f:
                if f.read().strip() == backing:
                    return dev
        except OSError:
            pass
    return ""


def compiles(top):
    """Compiles every .py file under top (writing nothing: the tree may be
    read-only) and reports the syntax errors."""
    ok = True
    for d, dirs, names in os.walk(top):
        dirs[:] = [x for x in dirs if x not in ("__pycache__", "build", "dist")]
        for n in names:
            if n.endswith(".py"):
                path = os.path.join(d, n)
                with open(path, "rb") as f:
                    src = f.read()
                try:
                    compile(src, path, "exec", dont_inherit=True)
                except SyntaxError as e:
                    log(f"{path}:{e.lineno}: {e.msg}")
                    ok = False
    return ok


class Daemon:
    def __init__(self, molt_bin, tmp):
        self.bin = molt_bin
        self.root = os.path.join(tmp, "root")
        self.socket = os.path.join(tmp, "molt.sock")
        self.log = os.path.join(tmp, "daemon.log")
        self.proc = None
        self.tmp = tmp
        self.endpoint = self.tls_ca = ""

    def tls(self):
        """A self-signed certificate for 127.0.0.1 and a free port: the
        daemon's TLS listener for tenants' tokens (the remote client)."""
        cert, key = os.path.join(self.tmp, "cert.pem"), os.path.join(self.tmp, "key.pem")
        r = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                            "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=molt test",
                            "-addext", "subjectAltName=IP:127.0.0.1"], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("openssl: " + r.stderr)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.endpoint, self.tls_ca = f"https://127.0.0.1:{port}", cert
        return ["--listen", f"tcp://127.0.0.1:{port}", "--tls-cert", cert, "--tls-key", key]

    def start(self, molt):
        args = [self.bin, "daemon", "--root", self.root, "--socket", self.socket, "--pool-size", "16G"]
        args += self.tls()
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(args, stdout=logf, stderr=logf, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        c = molt.Client(self.socket, timeout=10)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                c.host()
                return
            except molt.MoltError:
                time.sleep(0.1)
        raise RuntimeError("daemon did not come up:\n" + tail(self.log))

    def stop(self, molt):
        """Removes every sandbox, stops the daemon, unmounts the pool;
        returns the problems found."""
        problems = []
        if self.proc is None:
            return problems
        if self.proc.poll() is None:
            c = molt.Client(self.socket, timeout=120)
            try:
                for sb in c.sandboxes():
                    try:
                        c.remove_sandbox(sb.id)
                    except molt.MoltError as e:
                        problems.append(f"remove sandbox {sb.id}: {e}")
            except molt.MoltError as e:
                problems.append(f"list sandboxes: {e}")
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                problems.append("daemon did not stop within 15 s of SIGTERM; killed")
                self.proc.kill()
                self.proc.wait()
        pool = os.path.join(self.root, "pool")
        if mounted(pool):
            r = subprocess.run(["umount", pool], capture_output=True, text=True)
            if r.returncode != 0:
                problems.append(f"unmount {pool}: {r.stderr.strip()}")
        img = os.path.join(self.root, "pool.img")
        deadline = time.monotonic() + 5
        while True:
            held = loop_holding(img)
            if not held:
                break
            if time.monotonic() > deadline:
                problems.append(f"loop device {held} still holds {img}")
                break
            time.sleep(0.05)
        return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--molt", default="bin/molt", help="the molt binary")
    ap.add_argument("--image", default="debian", help="the image the tests use")
    ap.add_argument("--compile-only", action="store_true", help="only check that every file compiles")
    ap.add_argument("unittest_args", nargs="*", help="passed to unittest (e.g. test_live.Exec)")
    args = ap.parse_args()

    if not compiles(PKG):
        return 1
    if args.compile_only:
        return 0

    # The tests that need no daemon run everywhere.
    if os.geteuid() != 0:
        if os.environ.get("MOLT_REQUIRE_PRIVILEGED") == "1":
            log("the live tests need root and MOLT_REQUIRE_PRIVILEGED=1 forbids skipping")
            return 1
        log("SKIPPED: the live tests need root (they start a daemon); running the unit tests only")
        return subprocess.call([sys.executable, "-m", "unittest", "discover", "-s", HERE, "-p", "test_unit.py"],
                               cwd=HERE, env=dict(os.environ, PYTHONPATH=PKG))

    molt_bin = os.path.abspath(args.molt)
    if not os.access(molt_bin, os.X_OK):
        log(f"{molt_bin} is not executable: run make build first")
        return 1
    started = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="molt-py-")
    site = os.path.join(tmp, "site")
    daemon = Daemon(molt_bin, tmp)
    code = 1
    try:
        # Installed as a user installs it, from the package directory with
        # no index: the tests import this copy, not the source tree.
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                            "--disable-pip-version-check", "--target", site, PKG],
                           capture_output=True, text=True)
        if r.returncode != 0:
            log(f"pip install {PKG} failed:\n{r.stdout}{r.stderr}")
            return 1
        sys.path.insert(0, site)
        import molt

        if not molt.__file__.startswith(site):
            log(f"imported molt from {molt.__file__}, not the installed copy")
            return 1
        daemon.start(molt)
        log(f"daemon up at {daemon.socket} ({time.monotonic() - started:.1f} s)")
        c = molt.Client(daemon.socket)
        lines = []
        img = c.build_image(args.image, progress=lines.append)
        log(f"image {img.name} ready ({len(lines)} progress lines, {time.monotonic() - started:.1f} s)")
        env = dict(os.environ, MOLT_SOCKET=daemon.socket, PYTHONPATH=site, MOLT_TEST_IMAGE=args.image,
                   MOLT_TEST_BUILD_PROGRESS=str(len(lines)), MOLT_TEST_ENDPOINT=daemon.endpoint,
                   MOLT_TEST_TLS_CA=daemon.tls_ca)
        cmd = [sys.executable, "-m", "unittest"]
        cmd += ["-v"] + args.unittest_args if args.unittest_args else \
            ["discover", "-v", "-s", HERE, "-t", HERE, "-p", "test_*.py"]
        # From tests/, so that the source tree's molt/ is not on the path.
        code = subprocess.call(cmd, cwd=HERE, env=env)
    except Exception as e:  # the harness reports, then cleans up
        log(f"{type(e).__name__}: {e}")
        log("daemon log:\n" + tail(daemon.log))
        code = 1
    finally:
        try:
            import molt  # noqa: F811 (installed above; stop needs its client)
            problems = daemon.stop(molt)
        except ImportError:
            problems = []
        for p in problems:
            log("teardown: " + p)
        if problems:
            code = code or 1
            log("daemon log:\n" + tail(daemon.log))
        elif code != 0:
            log("daemon log tail:\n" + tail(daemon.log, 2000))
        shutil.rmtree(tmp, ignore_errors=True)
        log(f"done in {time.monotonic() - started:.1f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())

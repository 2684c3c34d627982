"""A throwaway PostgreSQL server for integration tests.

    with Postgres() as pg:
        dsn = pg.create_database()      # a fresh database; its libpq DSN
        pg.restart()                    # fast stop, start again on the same port

initdb runs into a fresh temporary directory (data, Unix socket and server
log all live there); the server listens on 127.0.0.1 on a free port with
trust authentication for the superuser `tally`. initdb and postgres refuse to
run as root, so when the tests run as root the server's commands run as
`nobody` and the directory is handed to that user. close() (also at exit and
on leaving the `with` block) stops the server with -m immediate and removes
the directory; it is safe to call more than once.

The binaries come from $TALLY_PG_BIN, else the newest
/usr/lib/postgresql/*/bin (Debian's `postgresql` package). Where none is
installed, Postgres() raises unittest.SkipTest saying so.
"""

import atexit
import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import unittest

SUPERUSER = "tally"
_RUN_AS = "nobody"
_START_TIMEOUT_S = 60


def _bin_dir():
    explicit = os.environ.get("TALLY_PG_BIN")
    if explicit:
        return explicit
    candidates = glob.glob("/usr/lib/postgresql/*/bin")

    def version(path):
        try:
            return int(path.split("/")[-2])
        except ValueError:
            return -1
    candidates.sort(key=version)
    return candidates[-1] if candidates else None


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path, max_chars=6000):
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError as e:
        return "(no log at %s: %s)" % (path, e)
    return text[-max_chars:]


class PostgresError(RuntimeError):
    pass


class Postgres:
    """One postgres server in its own temporary directory (see the module
    docstring). Not thread-safe for concurrent stop()/start() calls; dsn()
    and create_database() may be called from any thread."""

    _db_counter = itertools.count(1)

    def __init__(self, fsync=False):
        """fsync=False (the default) trades crash safety of the machine for
        speed; a killed or restarted postmaster still recovers everything it
        committed, since the WAL is in the OS page cache."""
        self.bin = _bin_dir()
        if not self.bin or not os.path.exists(os.path.join(self.bin, "pg_ctl")):
            raise unittest.SkipTest(
                "PostgreSQL server binaries not found (install Debian's `postgresql` package, "
                "or set TALLY_PG_BIN to the directory holding initdb and pg_ctl)")
        self.fsync = fsync
        self.dir = None
        self.port = None
        self._running = False
        self._closed = False
        self._lock = threading.Lock()
        self.dir = tempfile.mkdtemp(prefix="tally_pg_")
        atexit.register(self.close)
        try:
            self.data_dir = os.path.join(self.dir, "data")
            self.socket_dir = os.path.join(self.dir, "socket")
            self.log_path = os.path.join(self.dir, "postgres.log")
            os.mkdir(self.socket_dir)
            self._as_root = os.geteuid() == 0
            if self._as_root:
                self._hand_over(self.dir)
            self._initdb()
            # A free port can be taken between our probe and the bind; try a
            # few before giving up.
            last = None
            for _ in range(3):
                self.port = _free_port()
                try:
                    self.start()
                    break
                except PostgresError as e:
                    last = e
            else:
                raise last
        except BaseException:
            self.close()
            raise

    # --- the contract -----------------------------------------------------

    def dsn(self, dbname="postgres"):
        """A libpq keyword/value connection string for `dbname` over TCP."""
        return "host=127.0.0.1 port=%d user=%s dbname=%s" % (self.port, SUPERUSER, dbname)

    def create_database(self):
        """Creates a fresh, empty database and returns its DSN."""
        name = "tally_%d_%d" % (os.getpid(), next(self._db_counter))
        self.psql("CREATE DATABASE %s" % name)
        return self.dsn(name)

    def stop(self):
        """Fast shutdown: open sessions are ended, the data is kept."""
        self._pg_ctl(["stop", "-m", "fast"], "stop")
        self._running = False

    def start(self):
        """Starts the server again on the same port with the same data."""
        self._pg_ctl([
            "start", "-l", self.log_path,
            "-o", "-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=%s "
                  "-c full_page_writes=%s -c max_connections=200"
                  % (self.port, self.socket_dir, "on" if self.fsync else "off",
                     "on" if self.fsync else "off")], "start")
        self._running = True

    def restart(self):
        self.stop()
        self.start()

    def close(self):
        """Stops the server (-m immediate) and removes its directory."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            if self.dir and os.path.exists(os.path.join(self.data_dir, "postmaster.pid")):
                subprocess.run(self._cmd(["pg_ctl", "-D", self.data_dir, "-w", "-t", "30",
                                          "stop", "-m", "immediate"]),
                               capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            pass
        finally:
            self._running = False
            if self.dir:
                shutil.rmtree(self.dir, ignore_errors=True)
            try:
                atexit.unregister(self.close)
            except Exception:  # noqa: BLE001 (interpreter shutting down)
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # --- helpers for tests ------------------------------------------------

    @property
    def running(self):
        return self._running

    def psql(self, sql, dbname="postgres", timeout=60):
        """Runs `sql` with psql (ON_ERROR_STOP) and returns its unaligned,
        tuples-only output: one row a line, columns separated by '|'."""
        result = subprocess.run(
            [os.path.join(self.bin, "psql"), "-X", "-v", "ON_ERROR_STOP=1", "-At",
             "-d", self.dsn(dbname), "-c", sql],
            capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise PostgresError("psql failed (exit %d) running %r on %s:\n%s"
                                % (result.returncode, sql, dbname, result.stderr.strip()))
        return result.stdout

    def logs(self):
        return _tail(self.log_path, max_chars=10 ** 7)

    # --- internals --------------------------------------------------------

    def _cmd(self, argv):
        argv = [os.path.join(self.bin, argv[0])] + list(argv[1:])
        if not self._as_root:
            return argv
        if shutil.which("setpriv"):
            return ["setpriv", "--reuid=" + _RUN_AS, "--regid=nogroup", "--clear-groups",
                    "--"] + argv
        return ["runuser", "-u", _RUN_AS, "--"] + argv

    def _hand_over(self, path):
        user = pwd.getpwnam(_RUN_AS)
        for root, dirs, files in os.walk(path):
            os.chown(root, user.pw_uid, user.pw_gid)
            for f in files:
                os.chown(os.path.join(root, f), user.pw_uid, user.pw_gid)
        # The parent of a mkdtemp directory must be searchable by nobody.
        parent = os.path.dirname(path)
        if not os.stat(parent).st_mode & 0o001:
            raise PostgresError(
                "%s is not searchable by %s; set TMPDIR to a world-searchable directory such "
                "as /tmp" % (parent, _RUN_AS))

    def _run(self, argv, what, timeout):
        try:
            result = subprocess.run(self._cmd(argv), capture_output=True, text=True,
                                    timeout=timeout, cwd=self.dir)
        except subprocess.TimeoutExpired as e:
            raise PostgresError("%s timed out after %ds: %s\n--- postgres log ---\n%s"
                                % (what, timeout, " ".join(argv), _tail(self.log_path))) from e
        if result.returncode != 0:
            raise PostgresError(
                "%s failed (exit %d): %s\n%s%s\n--- postgres log (%s) ---\n%s"
                % (what, result.returncode, " ".join(argv), result.stdout, result.stderr,
                   self.log_path, _tail(self.log_path)))
        return result

    def _initdb(self):
        self._run(["initdb", "-D", self.data_dir, "-A", "trust", "-U", SUPERUSER,
                   "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"],
                  "initdb", timeout=120)

    def _pg_ctl(self, args, what):
        self._run(["pg_ctl", "-D", self.data_dir, "-w", "-t", str(_START_TIMEOUT_S)] + args,
                  "pg_ctl " + what, timeout=_START_TIMEOUT_S + 30)


class DatabaseTestCase(unittest.TestCase):
    """A test class with one throwaway server (self.pg) for all its tests;
    create_database() gives a test a fresh database: self.dsn, self.dbname."""

    @classmethod
    def setUpClass(cls):
        cls.pg = Postgres()

    @classmethod
    def tearDownClass(cls):
        cls.pg.close()

    def create_database(self):
        self.dsn = self.pg.create_database()
        self.dbname = self.dsn.rsplit("dbname=", 1)[1]

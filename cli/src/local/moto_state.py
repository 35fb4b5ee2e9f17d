"""What keeps the local emulator's state across its restarts and crashes.

moto holds everything in memory. With a state directory, the server
(``armada_moto.py --state-dir DIR``) keeps two things there:

- ``journal-<seq>.log``: every request that changes state, appended and
  flushed to the operating system *before* its answer is sent, so whatever
  the emulator acknowledged survives a ``kill -9``. Requests that change
  state run one at a time, each with the time it started and a random
  generator seeded by its sequence number, so replaying them in journal
  order rebuilds the same items, messages, ids and receipt handles.
- ``snapshot.pickle``: moto's backends as of one sequence number, written
  aside and renamed into place (at ``SIGTERM``, after a recovery, and when
  the journal outgrows the snapshot); the journals it covers are removed.

SQS receives are the exception to replaying requests: which messages a
receive took depends on the moment and on which groups were in flight, so
the journal records what it did (message ids, receipt handles, visibility)
rather than what it asked, and recovery applies exactly that.

A record cut short by a crash was never answered; recovery stops there.
"""

import datetime
import fcntl
import io
import os
import pickle
import random
import signal
import struct
import sys
import threading
import time
import zlib
from urllib.parse import parse_qs

import moto.core.utils as moto_utils
from moto import backends as moto_backends
from moto.core import DEFAULT_ACCOUNT_ID
from moto.core.base_backend import BackendDict
from moto.moto_api._internal.moto_random import MotoRandom

# Names of actions that only read, by prefix (JSON and query protocols).
_READ_PREFIXES = (
    "Get",
    "Describe",
    "List",
    "Query",
    "Scan",
    "BatchGet",
    "TransactGet",
    "Head",
)

# The regions whose default network is made at start (see
# ``Journal._make_defaults``): the local stack's, and the environment's.
_DEFAULT_REGIONS = sorted(
    {"us-east-1"}
    | {os.environ[k] for k in ("AWS_REGION", "AWS_DEFAULT_REGION") if os.environ.get(k)}
)

# The journal is compacted once it outgrows the snapshot and this (bytes).
_COMPACT_AT_LEAST = int(os.environ.get("ARMADA_MOTO_COMPACT_BYTES", 16 << 20))

# A journal record: payload length and CRC-32, then the pickled payload.
_FRAME = struct.Struct("<II")

# The journaled request this thread is running: its time and its randomness.
_request = threading.local()

_moto_utcnow = moto_utils.utcnow
_moto_getrandbits = MotoRandom.getrandbits
_moto_random = MotoRandom.random


def _utcnow():
    now = getattr(_request, "now", None)
    if now is None:
        return _moto_utcnow()
    return datetime.datetime.fromtimestamp(now, datetime.timezone.utc).replace(
        tzinfo=None
    )


def _getrandbits(self, k):
    rng = getattr(_request, "rng", None)
    return rng.getrandbits(k) if rng is not None else _moto_getrandbits(self, k)


def _random(self):
    rng = getattr(_request, "rng", None)
    return rng.random() if rng is not None else _moto_random(self)


def _install_clock_and_randomness():
    """moto reads the time through ``moto.core.utils.utcnow`` and draws every
    id from one ``MotoRandom``: both answer per journaled request instead."""
    moto_utils.utcnow = _utcnow
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "") or ""
        if name.startswith("moto") and getattr(module, "utcnow", None) is _moto_utcnow:
            module.utcnow = _utcnow
    MotoRandom.getrandbits = _getrandbits
    MotoRandom.random = _random


def _action(environ, body):
    target = environ.get("HTTP_X_AMZ_TARGET")
    if target:
        return target.rsplit(".", 1)[-1]
    if "x-www-form-urlencoded" in environ.get("CONTENT_TYPE", ""):
        found = parse_qs(body.decode("utf-8", "replace")).get("Action")
        if found:
            return found[0]
    found = parse_qs(environ.get("QUERY_STRING", "")).get("Action")
    return found[0] if found else None


def changes_state(environ, body):
    """Whether a request can change the emulator's state. ``ReceiveMessage``
    does, but is journaled by what it did (see the receive hook)."""
    action = _action(environ, body)
    if action is not None:
        return action != "ReceiveMessage" and not action.startswith(_READ_PREFIXES)
    return environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD", "OPTIONS")


def _read_body(environ):
    stream = environ["wsgi.input"]
    length = environ.get("CONTENT_LENGTH")
    if length:
        return stream.read(int(length))
    if environ.get("wsgi.input_terminated"):
        return stream.read()
    return b""


def _plain_environ(environ):
    return {
        k: v
        for k, v in environ.items()
        if isinstance(v, str) and not k.startswith(("wsgi.", "werkzeug."))
    }


def _call(app, environ, body):
    environ = dict(environ)
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))
    environ.setdefault("wsgi.url_scheme", "http")
    environ["wsgi.errors"] = sys.stderr
    environ["wsgi.multithread"] = True
    environ["wsgi.multiprocess"] = False
    environ["wsgi.run_once"] = False
    environ["wsgi.version"] = (1, 0)
    answer = {}

    def start_response(status, headers, exc_info=None):
        answer["status"] = status
        answer["headers"] = headers

    result = app(environ, start_response)
    try:
        chunks = list(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    return answer.get("status", "500 INTERNAL SERVER ERROR"), answer.get("headers", []), chunks


def _receive_key(backend, queue_name):
    return (backend.account_id, backend.region_name, queue_name)


class Journal:
    """The state directory: its snapshot, its journals, and the one lock
    every state-changing request holds while it runs and is recorded."""

    def __init__(self, directory):
        self.dir = directory
        # It holds the stack's keys and everything else: its owner's alone.
        os.umask(0o077)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        # One process at a time: an emulator started while the last one is
        # still writing its snapshot waits for it here.
        self.owner = open(os.path.join(directory, "lock"), "w")  # noqa: SIM115
        fcntl.flock(self.owner, fcntl.LOCK_EX)
        self.lock = threading.Lock()
        self.seq = 0
        self.salt = None
        self.file = None
        self.journal_bytes = 0
        self.snapshot_bytes = 0
        self.replayed = 0

    # -- recording ---------------------------------------------------------

    def _append(self, record):
        payload = pickle.dumps(record, protocol=5)
        self.file.write(_FRAME.pack(len(payload), zlib.crc32(payload)) + payload)
        # To the operating system before the answer: a killed emulator
        # loses nothing it acknowledged.
        self.file.flush()
        self.journal_bytes += _FRAME.size + len(payload)

    def _begin(self, now):
        self.seq += 1
        _request.now = now
        _request.rng = random.Random(f"{self.salt}:{self.seq}")

    @staticmethod
    def _end():
        _request.now = None
        _request.rng = None

    def run_request(self, app, environ, body):
        plain = _plain_environ(environ)
        with self.lock:
            now = time.time()
            self._begin(now)
            try:
                answer = _call(app, environ, body)
                self._append(("request", self.seq, now, plain, body))
            finally:
                self._end()
            self._compact_if_due()
        return answer

    def record_receive(self, backend, queue_name, taken, dead_lettered):
        """Called with the lock held, from a receive's scan."""
        self.seq += 1
        self._append(
            (
                "receive",
                self.seq,
                _receive_key(backend, queue_name),
                taken,
                dead_lettered,
            )
        )

    # -- snapshots ---------------------------------------------------------

    def _snapshot_path(self):
        return os.path.join(self.dir, "snapshot.pickle")

    def _journal_paths(self):
        found = []
        for name in os.listdir(self.dir):
            if name.startswith("journal-") and name.endswith(".log"):
                found.append((int(name[len("journal-") : -len(".log")]), name))
        return [os.path.join(self.dir, n) for _, n in sorted(found)]

    def _open_journal(self):
        if self.file is not None:
            self.file.close()
        path = os.path.join(self.dir, f"journal-{self.seq + 1}.log")
        self.file = open(path, "ab")  # noqa: SIM115 - open for the process's life
        self.journal_bytes = self.file.tell()

    def snapshot(self):
        """Writes the snapshot; called with the lock held."""
        backends = {}
        for backend_dict in BackendDict._instances:
            name = backend_dict.service_name
            if moto_backends.get_backend(name) is not backend_dict:
                raise RuntimeError(f"cannot find moto's {name} backends again")
            backends[name] = {
                account: dict(regions) for account, regions in backend_dict.items()
            }
        tmp = self._snapshot_path() + ".tmp"
        with open(tmp, "wb") as f:
            _Pickler(f, protocol=5).dump(
                {"seq": self.seq, "salt": self.salt, "backends": backends}
            )
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._snapshot_path())
        self.snapshot_bytes = os.path.getsize(self._snapshot_path())
        covered = self._journal_paths()
        self._open_journal()
        for path in covered:
            os.remove(path)

    def _compact_if_due(self):
        # A snapshot costs about what replaying as many journal bytes does:
        # compacting once the journal outgrows it keeps both bounded.
        if self.journal_bytes > max(_COMPACT_AT_LEAST, self.snapshot_bytes):
            self.snapshot()

    # -- recovery ----------------------------------------------------------

    def recover(self, app):
        """Loads the snapshot, replays the journals after it, and opens a
        journal for what comes next. Returns how many records it replayed."""
        snapshot_seq = 0
        path = self._snapshot_path()
        if os.path.exists(path):
            with open(path, "rb") as f:
                saved = pickle.load(f)
            snapshot_seq = saved["seq"]
            self.salt = saved["salt"]
            for name, accounts in saved["backends"].items():
                backend_dict = moto_backends.get_backend(name)
                for account, regions in accounts.items():
                    per_account = backend_dict[account]
                    for region, backend in regions.items():
                        dict.__setitem__(per_account, region, backend)
            self.snapshot_bytes = os.path.getsize(path)
        if self.salt is None:
            self.salt = os.urandom(8).hex()
        self._make_defaults()
        self.seq = snapshot_seq
        for journal in self._journal_paths():
            for record in _records(journal):
                if record[1] <= self.seq:
                    continue
                self._replay(app, record)
                self.seq = record[1]
                self.replayed += 1
        if self.replayed or not os.path.exists(path):
            self.snapshot()
        else:
            self._open_journal()
        return self.replayed

    def _make_defaults(self):
        """Makes, under the state's own randomness, what moto makes the
        first time a region's EC2 is touched: the default VPC, its subnets
        and its security group. A task's network names their ids, so they
        must come out the same on every start, whichever request touched
        EC2 first (a read, which is not journaled, or a journaled write,
        seeded by its own number); from a snapshot that holds them, this
        changes nothing."""
        ec2 = moto_backends.get_backend("ec2")
        _request.rng = random.Random(f"{self.salt}:defaults")
        try:
            for region in _DEFAULT_REGIONS:
                ec2[DEFAULT_ACCOUNT_ID][region]
        finally:
            self._end()

    def _replay(self, app, record):
        if record[0] == "request":
            _, seq, now, environ, body = record
            _request.now = now
            _request.rng = random.Random(f"{self.salt}:{seq}")
            try:
                _call(app, environ, body)
            except Exception as e:  # noqa: BLE001 - one record, not the state
                # What this request did is not what it did the first time:
                # the state has drifted (a bug to fix), but starting with
                # the rest of it beats not starting at all.
                print(
                    f"armada_moto: replaying record {seq} "
                    f"({_action(environ, body)}) failed: {e!r}",
                    file=sys.stderr,
                    flush=True,
                )
            finally:
                self._end()
        elif record[0] == "receive":
            _, _, key, taken, dead_lettered = record
            _apply_receive(key, taken, dead_lettered)


def _records(path):
    with open(path, "rb") as f:
        while True:
            head = f.read(_FRAME.size)
            if len(head) < _FRAME.size:
                return
            length, crc = _FRAME.unpack(head)
            payload = f.read(length)
            if len(payload) < length or zlib.crc32(payload) != crc:
                # Cut short by a crash: never answered, so never promised.
                return
            yield pickle.loads(payload)


def _apply_receive(key, taken, dead_lettered):
    account, region, queue_name = key
    backend = moto_backends.get_backend("sqs")[account][region]
    queue = backend.get_queue(queue_name)
    by_id = {m.id: m for m in queue._messages}
    for message_id, handle, visible_at, count, first_receive in taken:
        message = by_id.get(message_id)
        if message is None:
            continue
        message._old_receipt_handles.append(message.receipt_handle)
        message.receipt_handle = handle
        message.visible_at = visible_at
        message.approximate_receive_count = count
        message.approximate_first_receive_timestamp = first_receive
        queue.pending_messages.add(message)
    for message_id in dead_lettered:
        message = by_id.get(message_id)
        if message is not None and queue.dead_letter_queue is not None:
            # The scan that moved it took it out of the messages in flight
            # first (it was visible again): so must the replay, or a FIFO
            # queue would hold its group for a message no longer there.
            queue.pending_messages.discard(message)
            queue._messages.remove(message)
            queue.dead_letter_queue.add_message(message)


_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))


class _Pickler(pickle.Pickler):
    """Locks and conditions are not state: they are made afresh."""

    def reducer_override(self, obj):
        if isinstance(obj, threading.Condition):
            return (threading.Condition, ())
        if isinstance(obj, _LOCK_TYPES[0]):
            return (threading.Lock, ())
        if isinstance(obj, _LOCK_TYPES[1]):
            return (threading.RLock, ())
        return NotImplemented


class Journaled:
    """The WSGI application in front of moto's: state-changing requests go
    through the journal, the others straight through."""

    def __init__(self, app, journal):
        self.app = app
        self.journal = journal

    def __call__(self, environ, start_response):
        body = _read_body(environ)
        if not changes_state(environ, body):
            environ["wsgi.input"] = io.BytesIO(body)
            return self.app(environ, start_response)
        status, headers, chunks = self.journal.run_request(self.app, environ, body)
        start_response(status, headers)
        return chunks


_journal = None


def journal():
    """The journal this process keeps, if it was given a state directory."""
    return _journal


def open_state(directory, app):
    """Recovers the state in ``directory`` into moto, and arranges for
    ``SIGTERM``/``SIGINT`` to write a snapshot before the process ends."""
    global _journal
    _install_clock_and_randomness()
    started = time.monotonic()
    _journal = Journal(directory)
    replayed = _journal.recover(app)
    print(
        f"armada_moto: state from {directory}: {replayed} journal records "
        f"replayed in {time.monotonic() - started:.2f}s",
        file=sys.stderr,
        flush=True,
    )

    stopping = []

    def stop(signum, frame):
        # A second signal (a parent-death SIGTERM after `armada down`'s,
        # say) runs this again, in the same thread, inside the first: it
        # must not wait for the lock the first one holds.
        if stopping:
            return
        stopping.append(signum)
        # The lock stays held: nothing is answered after the snapshot.
        _journal.lock.acquire()
        try:
            _journal.snapshot()
        finally:
            os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return Journaled(app, _journal)

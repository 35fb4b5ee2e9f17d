"""The moto server as the local stack runs it.

Two changes to moto's DynamoDB, both about cost, neither about meaning:

- ``TransactWriteItems`` keeps, for its rollback, a copy of just the items
  the transaction touches instead of a deep copy of every table it names.
  moto's own rollback makes each transaction cost O(items stored), so a
  local stack slowed and grew as it filled. A cancelled transaction still
  leaves no trace: every item it wrote is put back as it was (or removed,
  if it did not exist).
- ``Query`` on a table's own key reads the one partition it names instead
  of sorting every item of the table and keeping those of that partition
  (O(items stored) per query). Same items, same order, same paging.

And three to its SQS. A FIFO queue's deduplication remembers what was
sent in the last five minutes, as SQS's does, not only what it still
holds. And two about a long poll on a FIFO queue whose visible
messages all belong to groups with a message in flight (a parent Run's
group, with its children's ends queued behind the one being noted):

- it re-scanned the queue in a busy loop until its wait ended (moto's wait
  returns at once while any message is visible, taken or not), holding a
  core and the GIL, and stalled the whole emulator. Now it waits a moment
  between scans; a message added still wakes it at once.
- it judged the groups in flight once, when it began, so a group freed by
  a deletion stayed closed to it until its wait ended (up to 20 s a batch).
  Now each scan looks again, as SQS does.

And two that are about meaning: DynamoDB's ``TransactWriteItems``
honours ``ClientRequestToken`` and ECS's ``RunTask`` its ``clientToken``,
as AWS does (see below).

The patch is written against one moto version; any other refuses to start
rather than run with a rollback nobody checked.
"""

import argparse
import copy
import json
import os
import random
import signal
import sys
import threading
import time

import moto
import moto.dynamodb.models as ddb_models
import moto.sqs.models as sqs_models
from moto.core.utils import unix_time
from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.exceptions import DynamodbException
from moto.dynamodb.models.table import Table
from moto.dynamodb.responses import DynamoHandler
from moto.core.responses import ActionResult
from moto.ecs.exceptions import ECSException
from moto.ecs.responses import EC2ContainerServiceResponse

import moto_state

PINNED = "5.2.5"


class _TablesAreNotCopied:
    """Stands in for the ``copy`` module inside moto.dynamodb.models.

    That module deep-copies a Table only for the transaction rollback
    (moto 5.2.5, ``transact_write_items``); handing back the table itself
    makes moto's own restore a no-op, and the journal below does the real
    one. Every other deep copy there (items, in ``update_item``) is real.
    """

    @staticmethod
    def deepcopy(value, memo=None):
        if isinstance(value, Table):
            return value
        return copy.deepcopy(value, memo)

    def __getattr__(self, name):
        return getattr(copy, name)


def _key_values(table, op_type, op):
    attrs = op["Item"] if op_type == "Put" else op.get("Key", {})
    hash_value = DynamoType(attrs[table.hash_key_attr])
    range_value = None
    if table.range_key_attr is not None:
        range_value = DynamoType(attrs[table.range_key_attr])
    return hash_value, range_value


def _journal(backend, transact_items):
    """(table, hash, range, copy of the item or None) for every item named."""
    entries = []
    for entry in transact_items:
        for op_type, op in entry.items():
            table = backend.tables.get(op.get("TableName", ""))
            if table is None:
                continue
            try:
                hash_value, range_value = _key_values(table, op_type, op)
            except (KeyError, TypeError):
                continue  # moto itself rejects the malformed request
            try:
                current = table.get_item(hash_value, range_value)
            except Exception:  # noqa: BLE001 - moto validates it again
                continue
            entries.append((table, hash_value, range_value, copy.deepcopy(current)))
    return entries


def _restore(entries):
    # Newest first, so an item named twice ends as it was before the first.
    for table, hash_value, range_value, original in reversed(entries):
        if original is None:
            if range_value is not None:
                table.items.get(hash_value, {}).pop(range_value, None)
                if hash_value in table.items and not table.items[hash_value]:
                    del table.items[hash_value]
            else:
                table.items.pop(hash_value, None)
        elif range_value is not None:
            table.items[hash_value][range_value] = original
        else:
            table.items[hash_value] = original


_moto_transact_write_items = DynamoDBBackend.transact_write_items
# One transaction at a time, as DynamoDB isolates them: the journal is only a
# faithful rollback if no other transaction writes the same items meanwhile.
_transactions = threading.Lock()


def transact_write_items(self, transact_items):
    with _transactions:
        entries = _journal(self, transact_items)
        try:
            return _moto_transact_write_items(self, transact_items)
        except BaseException:
            _restore(entries)
            raise


class IdempotentParameterMismatch(DynamodbException):
    error_type = "com.amazonaws.dynamodb.v20120810#IdempotentParameterMismatchException"

    def __init__(self):
        super().__init__(
            IdempotentParameterMismatch.error_type,
            message="The request uses the same client token as a previous, but "
            "not identical request.",
        )


# How long DynamoDB remembers a transaction's ClientRequestToken.
_TOKEN_WINDOW_S = 600
_moto_handle_transact = DynamoHandler.transact_write_items
# One token checked and the transaction it names made at a time.
_tokens = threading.Lock()


def handle_transact_write_items(self):
    """DynamoDB's idempotent ``TransactWriteItems``, which moto 5.2.5 lacks:
    a request repeated with the same ``ClientRequestToken`` within 10
    minutes succeeds without being made again (the SDKs set one and keep it
    across their retries, so an answer lost after the commit is not taken
    for a refusal on the retry); the same token with other items is
    ``IdempotentParameterMismatchException``."""
    token = self.body.get("ClientRequestToken")
    if not token:
        return _moto_handle_transact(self)
    backend = self.dynamodb_backend
    digest = json.dumps(self.body.get("TransactItems"), sort_keys=True)
    with _tokens:
        # Kept on the backend, so a snapshot of the emulator keeps them.
        seen = backend.__dict__.setdefault("armada_client_tokens", {})
        now = unix_time()
        for old in [t for t, (_, at) in seen.items() if now - at > _TOKEN_WINDOW_S]:
            del seen[old]
        if token in seen:
            if seen[token][0] != digest:
                raise IdempotentParameterMismatch()
            return ActionResult({"ConsumedCapacity": [], "ItemCollectionMetrics": {}})
        answer = _moto_handle_transact(self)
        seen[token] = (digest, now)
        return answer


class EcsConflict(ECSException):
    def __init__(self):
        super().__init__(
            "ConflictException",
            "The request uses the same client token as a previous, but "
            "not identical request.",
        )


# How long ECS remembers a RunTask's clientToken.
_RUN_TOKEN_WINDOW_S = 24 * 3600
_moto_run_task = EC2ContainerServiceResponse.run_task


def run_task(self):
    """ECS's idempotent ``RunTask``, which moto 5.2.5 lacks: a request
    repeated with the same ``clientToken`` (in the same cluster, within a
    day) answers with the tasks the first one started and starts none; the
    same token with other parameters is ``ConflictException``."""
    token = self._get_param("clientToken")
    if not token:
        return _moto_run_task(self)
    backend = self.ecs_backend
    cluster = self._get_param("cluster", "default")
    params = json.loads(self.body or "{}")
    params.pop("clientToken", None)
    digest = json.dumps(params, sort_keys=True)
    with _tokens:
        # Kept on the backend, so a snapshot of the emulator keeps them.
        seen = backend.__dict__.setdefault("armada_run_tokens", {})
        now = unix_time()
        for old in [k for k, v in seen.items() if now - v[2] > _RUN_TOKEN_WINDOW_S]:
            del seen[old]
        key = (cluster, token)
        if key in seen:
            if seen[key][0] != digest:
                raise EcsConflict()
            tasks = backend.describe_tasks(cluster, seen[key][1])
            return ActionResult({"tasks": tasks, "failures": []})
        answer = _moto_run_task(self)
        started = [t.task_arn for t in answer.result["tasks"]]
        seen[key] = (digest, started, now)
        return answer


# The partition a table query is reading, for `all_items` below; per thread,
# as the server answers requests on threads of their own.
_partition = threading.local()
_moto_all_items = Table.all_items
_moto_query = Table.query


def _sort_key(item):
    return (item.hash_key, item.range_key) if item.range_key else item.hash_key


def all_items(self):
    hint = getattr(_partition, "hint", None)
    if hint is None or hint[0] is not self:
        return _moto_all_items(self)
    hash_key = hint[1]
    if self.range_key_attr:
        # `items` is a defaultdict: `get` does not create an empty partition.
        items = list(self.items.get(hash_key, {}).values())
    else:
        items = [self.items[hash_key]] if hash_key in self.items else []
    return sorted(items, key=_sort_key)


def query(self, *args, **kwargs):
    # moto 5.2.5's backend passes (hash_key, range_comparison, range_objs,
    # limit, exclusive_start_key, scan_index_forward, projection_expressions,
    # index_name, ...) positionally.
    hash_key = args[0] if args else kwargs.get("hash_key")
    index_name = args[7] if len(args) > 7 else kwargs.get("index_name")
    if index_name or hash_key is None:
        return _moto_query(self, *args, **kwargs)
    _partition.hint = (self, hash_key)
    try:
        return _moto_query(self, *args, **kwargs)
    finally:
        _partition.hint = None


# How long a long poll waits between scans when the messages it can see are
# all held back by their FIFO group (a deletion does not wake it).
_BLOCKED_SCAN_S = 0.02


def receive_message(
    self,
    queue_name,
    count,
    wait_seconds_timeout,
    visibility_timeout,
    message_attribute_names=None,
):
    """moto 5.2.5's ``SQSBackend.receive_message``, but for the groups in
    flight, read again at every scan instead of once at the start."""
    if message_attribute_names is None:
        message_attribute_names = []
    queue = self.get_queue(queue_name)
    result = []
    polling_end = unix_time() + wait_seconds_timeout
    while True:
        if result or (wait_seconds_timeout and unix_time() > polling_end):
            break
        journal = moto_state.journal()
        if journal is None:
            result = _scan(
                self, queue_name, queue, count, visibility_timeout, message_attribute_names
            )
        else:
            # A scan changes messages: it runs alone, as every journaled
            # request does, and is recorded by what it took.
            with journal.lock:
                taken, dead_lettered = [], []
                result = _scan(
                    self,
                    queue_name,
                    queue,
                    count,
                    visibility_timeout,
                    message_attribute_names,
                    taken,
                    dead_lettered,
                )
                if taken or dead_lettered:
                    journal.record_receive(self, queue_name, taken, dead_lettered)
        if not result:
            if wait_seconds_timeout == 0:
                break
            queue.wait_for_messages(1)
    return result


def _scan(
    backend,
    queue_name,
    queue,
    count,
    visibility_timeout,
    message_attribute_names,
    taken=None,
    dead_lettered=None,
):
    """One pass over a queue's messages: those it takes, marked received."""
    result = []
    pending_groups = queue.pending_message_groups
    messages_to_dlq = []
    for message in queue.messages:
        if not message.visible:
            continue
        if message in queue.pending_messages:
            # Pending but visible again: its consumer timed out.
            queue.pending_messages.remove(message)
            pending_groups = queue.pending_message_groups
        if message.group_id and queue.fifo_queue:
            if message.group_id in pending_groups:
                continue
        if (
            queue.dead_letter_queue is not None
            and queue.redrive_policy
            and message.approximate_receive_count
            >= queue.redrive_policy["maxReceiveCount"]
        ):
            messages_to_dlq.append(message)
            continue
        queue.pending_messages.add(message)
        message.mark_received(visibility_timeout=visibility_timeout)
        if taken is not None:
            taken.append(
                (
                    message.id,
                    message.receipt_handle,
                    message.visible_at,
                    message.approximate_receive_count,
                    message.approximate_first_receive_timestamp,
                )
            )
        message_copy = copy.deepcopy(message)
        sqs_models._filter_message_attributes(message_copy, message_attribute_names)
        if not backend.is_message_valid_based_on_retention_period(
            queue_name, message
        ):
            break
        result.append(message_copy)
        if len(result) >= count:
            break
    for message in messages_to_dlq:
        queue._messages.remove(message)
        queue.dead_letter_queue.add_message(message)
        if dead_lettered is not None:
            dead_lettered.append(message.id)
    return result


_moto_add_message = sqs_models.Queue.add_message


def add_message(self, message):
    """A FIFO queue drops a message whose deduplication id it was sent in
    the last five minutes, as SQS does, even if that message was received
    and deleted since (moto 5.2.5 compares only with the messages still
    held, so a repeat sent after the first was consumed got through here
    and would not in AWS). A dead-lettered message moved here is not a
    send."""
    deduplicated = self.fifo_queue and (
        self.attributes.get("ContentBasedDeduplication") == "true"
        or message.deduplication_id
    )
    if deduplicated and not message.approximate_receive_count:
        # Kept on the queue, so a snapshot of the emulator keeps them.
        sent = self.__dict__.setdefault("armada_dedup_sent", {})
        now = message.sent_timestamp
        window_ms = sqs_models.DEDUPLICATION_TIME_IN_SECONDS * 1000
        for old in [k for k, at in sent.items() if now - at >= window_ms]:
            del sent[old]
        if message.deduplication_id in sent:
            return
        sent[message.deduplication_id] = now
    _moto_add_message(self, message)


_moto_delete_message = sqs_models.Queue.delete_message


def delete_message(self, receipt_handle):
    """Only a message's latest receipt handle deletes it. SQS: "you must
    provide the most recently received ReceiptHandle for the message
    (otherwise, the request succeeds, but the message will not be
    deleted)". moto 5.2.5 deletes it given any handle it ever had, so a
    consumer whose visibility ran out (its host killed, its heartbeat cut
    off by an outage) deleted the message another consumer had received
    since and was still working on: if that one died too, nothing was
    left to carry its Run on."""
    for message in self._messages:
        if receipt_handle in message._old_receipt_handles:
            return
    _moto_delete_message(self, receipt_handle)


def wait_for_messages(self, timeout):
    with self._messages_lock:
        if self.messages:
            self._messages_lock.wait(timeout=min(timeout, _BLOCKED_SCAN_S))
        else:
            self._messages_lock.wait_for(lambda: self.messages, timeout=timeout)


def install():
    if moto.__version__ != PINNED:
        sys.exit(
            f"armada_moto: written for moto {PINNED}, found {moto.__version__}; "
            "reinstall the pinned version (remove .armada/venv)"
        )
    ddb_models.copy = _TablesAreNotCopied()
    DynamoDBBackend.transact_write_items = transact_write_items
    DynamoHandler.transact_write_items = handle_transact_write_items
    Table.all_items = all_items
    Table.query = query
    sqs_models.Queue.wait_for_messages = wait_for_messages
    sqs_models.Queue.add_message = add_message
    sqs_models.Queue.delete_message = delete_message
    sqs_models.SQSBackend.receive_message = receive_message
    EC2ContainerServiceResponse.run_task = run_task


class Slowed:
    """Answers a share of requests late, as a slow or throttled AWS does
    (``--slow PERCENT:MS``): before anything is done, so the request waits
    as a whole and nothing it changes is held meanwhile."""

    def __init__(self, app, percent, delay_ms, seed):
        self.app = app
        self.percent = percent
        self.delay_s = delay_ms / 1000.0
        self.rng = random.Random(seed)
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        with self.lock:
            late = self.rng.random() * 100 < self.percent
            delay = self.rng.random() * self.delay_s
        if late:
            time.sleep(delay)
        return self.app(environ, start_response)


def main(argv):
    parser = argparse.ArgumentParser(prog="armada_moto")
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=5000)
    parser.add_argument(
        "--state-dir",
        help="keep the emulator's state here, across restarts and crashes",
    )
    parser.add_argument(
        "--slow",
        metavar="PERCENT:MS",
        help="answer PERCENT of requests up to MS late (fault injection)",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("MOTO_PORT", str(args.port))
    install()
    from werkzeug.serving import run_simple
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )

    app = DomainDispatcherApplication(create_backend_app)
    app.debug = True
    if args.state_dir:
        app = moto_state.open_state(args.state_dir, app)
    else:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    if args.slow:
        percent, delay_ms = (float(x) for x in args.slow.split(":", 1))
        app = Slowed(app, percent, delay_ms, seed=args.port)
    run_simple(
        args.host,
        args.port,
        app,
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main(sys.argv[1:])

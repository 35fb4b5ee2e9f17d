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

And one to its SQS, about a long poll that must wait, not spin:

- ``ReceiveMessage`` with a wait, on a FIFO queue whose visible messages all
  belong to groups with a message in flight, re-scanned the queue in a
  busy loop until the wait ended (moto's wait returns at once while any
  message is visible, taken or not), holding a core and the GIL: a parent
  Run's group with children's ends queued behind one in flight stalled the
  whole emulator. Now such a poll waits a moment between scans; a message
  added still wakes it at once.

The patch is written against one moto version; any other refuses to start
rather than run with a rollback nobody checked.
"""

import copy
import sys
import threading

import moto
import moto.dynamodb.models as ddb_models
import moto.sqs.models as sqs_models
from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.table import Table

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
    Table.all_items = all_items
    Table.query = query
    sqs_models.Queue.wait_for_messages = wait_for_messages


if __name__ == "__main__":
    install()
    from moto.server import main

    main(sys.argv[1:])

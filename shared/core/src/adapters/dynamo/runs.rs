//! The runs and run_events tables. The Run record is one item: the fields the
//! claim and fence conditions test (`state`, `step`, `epoch`, `lease_until`,
//! `event_seq`) are top-level attributes and authoritative; the rest is a JSON
//! document. Every write after creation is conditional on the epoch and event
//! sequence the writer read, so a superseded worker cannot commit.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem, Update};
use aws_sdk_dynamodb::Client;

use armada_domain::run::{LogEvent, Run, RunEventRecord, RunHead, RunState};

use super::approvals::ApprovalStore;
use super::item::{get_json, get_n, get_s, json, n, opt_s, s, ttl_after, Item};
use super::{idempotency, quotas, sessions};
use crate::error::{classify, StoreError};
use crate::ports::{self, Also};

/// The attributes beside a Run's document ([`RunHead`]).
const HEAD_ATTRIBUTES: [&str; 12] = [
    "run_id",
    "tenant",
    "agent",
    "state",
    "step",
    "epoch",
    "event_seq",
    "created_at",
    "updated_at",
    "parent_run_id",
    "session_id",
    "session_seq",
];

/// How long events are kept.
const EVENT_TTL_DAYS: i64 = 30;

#[derive(Debug, Clone)]
pub struct RunStore {
    dynamo: Client,
    runs_table: String,
    events_table: String,
    /// Tables that [`Also`] writes land in, with the Run's.
    sessions_table: String,
    idempotency_table: String,
    approvals_table: String,
    quotas_table: String,
}

/// A transaction's items, each with what it belongs to: the Run (0), the
/// `i`-th [`Also`] (`1 + i`), or an event (`None`), so a failed condition
/// is reported as the caller's own index.
#[derive(Default)]
struct Transaction {
    items: Vec<TransactWriteItem>,
    owners: Vec<Option<usize>>,
}

impl Transaction {
    fn push(&mut self, owner: Option<usize>, item: TransactWriteItem) {
        self.items.push(item);
        self.owners.push(owner);
    }
}

pub use armada_domain::run::Stamp;

impl RunStore {
    pub fn new(
        dynamo: Client,
        runs_table: &str,
        events_table: &str,
        sessions_table: &str,
        idempotency_table: &str,
        approvals_table: &str,
        quotas_table: &str,
    ) -> Self {
        RunStore {
            dynamo,
            runs_table: runs_table.to_string(),
            events_table: events_table.to_string(),
            sessions_table: sessions_table.to_string(),
            idempotency_table: idempotency_table.to_string(),
            approvals_table: approvals_table.to_string(),
            quotas_table: quotas_table.to_string(),
        }
    }

    /// Adds the items of `also` to a transaction.
    fn push_also(&self, tx: &mut Transaction, also: Vec<Also>) {
        for (i, a) in also.into_iter().enumerate() {
            let owner = Some(1 + i);
            match a {
                Also::SessionMessage { header, run_id } => {
                    for item in sessions::accept_items(&self.sessions_table, &header, &run_id) {
                        tx.push(owner, item);
                    }
                }
                Also::SessionTurn {
                    session_id,
                    turn,
                    role,
                    content,
                    run_id,
                } => tx.push(
                    owner,
                    sessions::turn_item(
                        &self.sessions_table,
                        &session_id,
                        turn,
                        role,
                        &content,
                        &run_id,
                    ),
                ),
                Also::IdempotencyKey {
                    tenant,
                    key,
                    record,
                    now_ms,
                    keep_days,
                } => tx.push(
                    owner,
                    idempotency::claim_item(
                        &self.idempotency_table,
                        &tenant,
                        &key,
                        &record,
                        now_ms,
                        keep_days,
                    ),
                ),
                Also::Approval(a) => {
                    tx.push(owner, ApprovalStore::create_item(&self.approvals_table, &a))
                }
                Also::ActiveRun {
                    tenant,
                    run_id,
                    until_ms,
                } => tx.push(
                    owner,
                    quotas::active_item(&self.quotas_table, &tenant, &run_id, until_ms),
                ),
            }
        }
    }

    pub fn run_item(run: &Run) -> Item {
        let mut item = Item::new();
        item.insert("run_id".into(), s(&run.run_id));
        item.insert("tenant".into(), s(&run.tenant));
        item.insert("agent".into(), s(&run.agent));
        item.insert("state".into(), s(run.state().as_str()));
        item.insert("step".into(), n(run.step));
        item.insert("epoch".into(), n(run.epoch));
        item.insert("lease_until".into(), n(run.lease_until_ms));
        item.insert("event_seq".into(), n(run.event_seq));
        item.insert("created_at".into(), n(run.created_at_ms));
        item.insert("updated_at".into(), n(run.updated_at_ms));
        if let Some(p) = &run.parent_run_id {
            item.insert("parent_run_id".into(), s(p));
        }
        // Beside the document too, so a Run whose document cannot be read
        // still lets its session go on (`RunHead`).
        if let (Some(id), Some(seq)) = (&run.session_id, run.session_seq) {
            item.insert("session_id".into(), s(id));
            item.insert("session_seq".into(), n(seq));
        }
        item.insert("doc".into(), json(run));
        item
    }

    fn head_of(item: &Item) -> Result<RunHead, StoreError> {
        let state = get_s(item, "state")?;
        Ok(RunHead {
            run_id: get_s(item, "run_id")?,
            tenant: get_s(item, "tenant")?,
            agent: get_s(item, "agent")?,
            state: RunState::parse(&state)
                .ok_or_else(|| StoreError::Corrupt(format!("unknown run state {state}")))?,
            step: get_n(item, "step")?,
            epoch: get_n(item, "epoch")?,
            event_seq: get_n(item, "event_seq")?,
            created_at_ms: get_n(item, "created_at")?,
            updated_at_ms: get_n(item, "updated_at")?,
            parent_run_id: opt_s(item, "parent_run_id"),
            session_id: opt_s(item, "session_id"),
            session_seq: get_n(item, "session_seq").ok(),
        })
    }

    fn from_item(item: &Item) -> Result<Run, StoreError> {
        let doc: Run = get_json(item, "doc")?;
        let state = get_s(item, "state")?;
        let state = RunState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown run state {state}")))?;
        let mut run = doc.as_stored(state);
        run.step = get_n(item, "step")?;
        run.epoch = get_n(item, "epoch")?;
        run.lease_until_ms = get_n(item, "lease_until")?;
        run.event_seq = get_n(item, "event_seq")?;
        run.updated_at_ms = get_n(item, "updated_at")?;
        Ok(run)
    }

    pub fn event_item(run_id: &str, ev: &RunEventRecord) -> Item {
        let mut item = Item::new();
        item.insert("run_id".into(), s(run_id));
        item.insert("seq".into(), n(ev.seq));
        item.insert("type".into(), s(ev.kind().as_str()));
        item.insert("at".into(), n(ev.at_ms));
        item.insert("data".into(), json(&ev.fields()));
        item.insert("expires_at".into(), ttl_after(ev.at_ms, EVENT_TTL_DAYS));
        item
    }

    fn event_put(&self, run_id: &str, ev: &RunEventRecord) -> TransactWriteItem {
        put(
            &self.events_table,
            Self::event_item(run_id, ev),
            "attribute_not_exists(seq)",
        )
    }

    /// Reads a Run (strongly consistent).
    /// Creates a Run with its first events, plus the items that must be
    /// written atomically with it (idempotency record, session slot).
    /// Claims a step for a harness worker: writes `claimed` (the Run as
    /// the domain's `Claimed` event left it: new state, next epoch, a lease)
    /// with one conditional update on the version `read` and an expired
    /// lease, so of two workers claiming the same step one wins.
    /// Extends the lease of a step that is still working, if `epoch` still
    /// owns it and has not ended it (a commit or a release sets the lease to
    /// 0, and a renewal must never revive it). `false`: the step is no
    /// longer ours to renew.
    /// Gives a claimed step back (lease expired now), if `epoch` still owns it.
    /// Sets the lease if `epoch` still owns the Run (and, with
    /// `only_if_live`, its lease has not been ended); `false` when not.
    async fn set_lease(
        &self,
        run_id: &str,
        epoch: u64,
        lease_until_ms: i64,
        only_if_live: bool,
    ) -> Result<bool, StoreError> {
        let mut update = self
            .dynamo
            .update_item()
            .table_name(&self.runs_table)
            .key("run_id", s(run_id))
            .update_expression("SET lease_until = :lease")
            .condition_expression("epoch = :epoch")
            .expression_attribute_values(":lease", n(lease_until_ms))
            .expression_attribute_values(":epoch", n(epoch));
        if only_if_live {
            update = update
                .condition_expression("epoch = :epoch AND lease_until > :zero")
                .expression_attribute_values(":zero", n(0));
        }
        match update.send().await {
            Ok(_) => Ok(true),
            Err(e) => match classify(e) {
                StoreError::Conflict { .. } => Ok(false),
                other => Err(other),
            },
        }
    }

    /// Writes a transaction; a failed condition names its owner.
    async fn transact(&self, tx: Transaction) -> Result<(), StoreError> {
        super::item::transact(&self.dynamo, tx.items, &tx.owners).await
    }
}

#[async_trait]
impl ports::Runs for RunStore {
    async fn get(&self, run_id: &str) -> Result<Option<Run>, StoreError> {
        let out = self
            .dynamo
            .get_item()
            .table_name(&self.runs_table)
            .key("run_id", s(run_id))
            .consistent_read(true)
            .send()
            .await
            .map_err(classify)?;
        out.item().map(Self::from_item).transpose()
    }
    async fn head(&self, run_id: &str) -> Result<Option<RunHead>, StoreError> {
        let out = self
            .dynamo
            .get_item()
            .table_name(&self.runs_table)
            .key("run_id", s(run_id))
            // Every name aliased: some are DynamoDB reserved words.
            .projection_expression(
                HEAD_ATTRIBUTES
                    .iter()
                    .enumerate()
                    .map(|(i, _)| format!("#h{i}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            )
            .set_expression_attribute_names(Some(
                HEAD_ATTRIBUTES
                    .iter()
                    .enumerate()
                    .map(|(i, a)| (format!("#h{i}"), (*a).to_string()))
                    .collect(),
            ))
            .consistent_read(true)
            .send()
            .await
            .map_err(classify)?;
        out.item().map(Self::head_of).transpose()
    }
    async fn create(
        &self,
        run: &Run,
        events: &[RunEventRecord],
        also: Vec<Also>,
    ) -> Result<(), StoreError> {
        let mut tx = Transaction::default();
        let run_put = put(
            &self.runs_table,
            Self::run_item(run),
            "attribute_not_exists(run_id)",
        );
        tx.push(Some(0), run_put);
        self.push_also(&mut tx, also);
        for e in events {
            tx.push(None, self.event_put(&run.run_id, e));
        }
        self.transact(tx).await
    }
    async fn claim(&self, read: &Run, claimed: &Run) -> Result<(), StoreError> {
        // The SDK sends a request again when its answer was lost, and the
        // first may have been made: then its condition no longer holds.
        // A claim names itself, so the repeat is recognised as made.
        let claim_id = format!("{:032x}", rand::random::<u128>());
        self.dynamo
            .update_item()
            .table_name(&self.runs_table)
            .key("run_id", s(&read.run_id))
            .update_expression(
                "SET #state = :to, epoch = :next, lease_until = :lease, updated_at = :now, claim_id = :claim",
            )
            .condition_expression(
                "(#state = :from AND step = :step AND epoch = :epoch AND lease_until <= :now) OR claim_id = :claim",
            )
            .expression_attribute_values(":claim", s(&claim_id))
            .expression_attribute_names("#state", "state")
            .expression_attribute_values(":to", s(claimed.state().as_str()))
            .expression_attribute_values(":next", n(claimed.epoch))
            .expression_attribute_values(":lease", n(claimed.lease_until_ms))
            .expression_attribute_values(":now", n(claimed.updated_at_ms))
            .expression_attribute_values(":from", s(read.state().as_str()))
            .expression_attribute_values(":step", n(read.step))
            .expression_attribute_values(":epoch", n(read.epoch))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }
    async fn renew(
        &self,
        run_id: &str,
        epoch: u64,
        lease_until_ms: i64,
    ) -> Result<bool, StoreError> {
        self.set_lease(run_id, epoch, lease_until_ms, true).await
    }
    async fn release(&self, run_id: &str, epoch: u64) -> Result<(), StoreError> {
        self.set_lease(run_id, epoch, 0, false).await.map(|_| ())
    }
    async fn save(
        &self,
        prev: Stamp,
        run: &Run,
        events: &[RunEventRecord],
        also: Vec<Also>,
    ) -> Result<(), StoreError> {
        let mut item = Self::run_item(run);
        item.remove("run_id");
        // The lease belongs to the claim and its renewals: a save may end it
        // (0) but never writes back the value it read, which a renewal may
        // have moved on meanwhile.
        if run.lease_until_ms != 0 {
            item.remove("lease_until");
        }
        let mut names = std::collections::HashMap::new();
        let mut values = std::collections::HashMap::new();
        let mut sets = Vec::new();
        for (i, (k, v)) in item.into_iter().enumerate() {
            names.insert(format!("#f{i}"), k);
            values.insert(format!(":v{i}"), v);
            sets.push(format!("#f{i} = :v{i}"));
        }
        names.insert("#epoch".into(), "epoch".into());
        names.insert("#es".into(), "event_seq".into());
        values.insert(":prev_epoch".into(), n(prev.epoch));
        values.insert(":prev_es".into(), n(prev.event_seq));
        let expression = format!("SET {}", sets.join(", "));
        let condition = "#epoch = :prev_epoch AND #es = :prev_es";
        if events.is_empty() && also.is_empty() {
            // One item: a conditional update does it, at half a
            // transaction's cost.
            return match self
                .dynamo
                .update_item()
                .table_name(&self.runs_table)
                .key("run_id", s(&run.run_id))
                .update_expression(expression)
                .condition_expression(condition)
                .set_expression_attribute_names(Some(names))
                .set_expression_attribute_values(Some(values))
                .send()
                .await
                .map_err(classify)
            {
                Ok(_) => Ok(()),
                Err(StoreError::Conflict { .. }) => Err(StoreError::Conflict { which: Some(0) }),
                Err(e) => Err(e),
            };
        }
        let update = Update::builder()
            .table_name(&self.runs_table)
            .key("run_id", s(&run.run_id))
            .update_expression(expression)
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .build()
            .map_err(|e| StoreError::Terminal(e.to_string()))?;
        let mut tx = Transaction::default();
        tx.push(Some(0), TransactWriteItem::builder().update(update).build());
        for e in events {
            tx.push(None, self.event_put(&run.run_id, e));
        }
        self.push_also(&mut tx, also);
        self.transact(tx).await
    }
}

#[async_trait]
impl ports::RunEvents for RunStore {
    async fn events(
        &self,
        run_id: &str,
        after: u64,
        limit: i32,
    ) -> Result<Vec<RunEventRecord>, StoreError> {
        let out = self
            .dynamo
            .query()
            .table_name(&self.events_table)
            .key_condition_expression("run_id = :r AND seq > :after")
            .expression_attribute_values(":r", s(run_id))
            .expression_attribute_values(":after", n(after))
            .consistent_read(true)
            .limit(limit)
            .send()
            .await
            .map_err(classify)?;
        out.items()
            .iter()
            .map(|item| {
                let kind = get_s(item, "type")?;
                Ok(RunEventRecord {
                    seq: get_n(item, "seq")?,
                    at_ms: get_n(item, "at")?,
                    event: LogEvent::from_parts(&kind, get_json(item, "data")?)
                        .map_err(StoreError::Corrupt)?,
                })
            })
            .collect()
    }
}

/// A conditional Put for a transaction.
pub fn put(table: &str, item: Item, condition: &str) -> TransactWriteItem {
    let put = Put::builder()
        .table_name(table)
        .set_item(Some(item))
        .condition_expression(condition)
        .build()
        .expect("table, item and condition are set");
    TransactWriteItem::builder().put(put).build()
}

pub fn attr_map(pairs: &[(&str, AttributeValue)]) -> Item {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

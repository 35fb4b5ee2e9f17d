//! The sandboxes table. Three kinds of items share its `sandbox_key`:
//!
//! - `<tenant>#<agent>`: the [`SandboxRecord`] of an agent identity. Every
//!   write is conditional on the version read (creation on the key's
//!   absence), so the lifecycle in the domain runs as compare-and-swap.
//!   The control plane writes the whole item; the sandbox's agent writes
//!   its `report` (and the version) only, which is read as untrusted
//!   ([`armada_domain::sandbox::report`]).
//! - `call#<run>#<call>#<attempt>`: the sandbox's mark of a call. Starting a
//!   call is a conditional put, so a call runs at most once even if its
//!   message is delivered twice or its agent restarts, and a call the control
//!   plane abandoned can never start late.
//! - `port#<host>#<port>`: a pooled port held by a sandbox.
//! - `uid#<tenant>#<agent>`: the host uid of an identity's sandboxes, taken
//!   once from the `uid-counter` item (an atomic `ADD`), so no two
//!   identities share a uid however their task ARNs look.

use aws_sdk_dynamodb::Client;

use armada_domain::sandbox::hand::CallMark;
use armada_domain::sandbox::lifecycle::{sandbox_key, SandboxRecord};

use super::item::{get_n, get_s, json, n, opt_s, s, ttl_after, written, Item};
use crate::error::{classify, StoreError};
use crate::ports;

use async_trait::async_trait;

/// How long call marks are kept.
const MARK_TTL_DAYS: i64 = 7;
/// The item whose `taken` counts the uids handed out.
const UID_COUNTER: &str = "uid-counter";

fn uid_key(tenant: &str, agent: &str) -> String {
    format!("uid#{}", sandbox_key(tenant, agent))
}

#[derive(Debug, Clone)]
pub struct SandboxStore {
    dynamo: Client,
    table: String,
}

pub use crate::ports::{CallRef, Change, StoredMark};

impl CallRef {
    fn key(&self) -> String {
        armada_domain::sandbox::access::mark_key(
            &self.tenant,
            &self.agent,
            &self.run_id,
            &self.call_id,
            self.attempt,
        )
    }
}

impl SandboxStore {
    pub fn new(dynamo: Client, table: &str) -> Self {
        SandboxStore {
            dynamo,
            table: table.to_string(),
        }
    }

    /// The control plane's write of a whole record: the control half in
    /// `doc` (with the report as it folded it), the report half again in
    /// `report`, where the agent writes it next.
    fn record_item(rec: &SandboxRecord) -> Item {
        let mut item = Item::new();
        item.insert("sandbox_key".into(), s(rec.key()));
        item.insert("tenant".into(), s(&rec.tenant));
        item.insert("agent".into(), s(&rec.agent));
        item.insert("state".into(), s(rec.state().as_str()));
        item.insert("generation".into(), n(rec.generation));
        item.insert("version".into(), n(rec.version));
        item.insert("doc".into(), json(rec));
        item.insert("report".into(), json(&rec.report()));
        item
    }

    /// A record as stored: its identity from its key, its control half
    /// from `doc`, its report half (untrusted) from `report`.
    fn from_item(item: &Item) -> Result<SandboxRecord, StoreError> {
        let key = get_s(item, "sandbox_key")?;
        let doc = get_s(item, "doc")?;
        let report = opt_s(item, "report");
        let version = get_n(item, "version")?;
        SandboxRecord::from_parts(&key, &doc, report.as_deref(), version)
            .map_err(|e| StoreError::Corrupt(e.to_string()))
    }

    async fn get_item(&self, key: &str) -> Result<Option<Item>, StoreError> {
        let out = self
            .dynamo
            .get_item()
            .table_name(&self.table)
            .key("sandbox_key", s(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(classify)?;
        Ok(out.item().cloned())
    }

    /// The sandboxes of one tenant (the `by_tenant` index).
    /// Every tenant's sandbox of one agent (a scan: deleting an agent is rare).
    /// Writes `rec` if the stored version is still `read_version` (or,
    /// with `None`, if there is no record yet).
    /// Removes an identity's record (the agent was deleted), if unchanged.
    fn mark_of(item: &Item) -> Result<StoredMark, StoreError> {
        let mark = match get_s(item, "mark")?.as_str() {
            "STARTED" => CallMark::Started,
            "FINISHED" => CallMark::Finished,
            "ABANDONED" => CallMark::Abandoned,
            other => return Err(StoreError::Corrupt(format!("call mark {other}"))),
        };
        Ok(StoredMark {
            mark,
            generation: get_n(item, "generation")?,
            at_ms: get_n(item, "at")?,
        })
    }

    /// The next value of the uid counter (1 for the first ever).
    async fn count_uid(&self) -> Result<u64, StoreError> {
        let out = self
            .dynamo
            .update_item()
            .table_name(&self.table)
            .key("sandbox_key", s(UID_COUNTER))
            .update_expression("ADD #taken :one")
            .expression_attribute_names("#taken", "taken")
            .expression_attribute_values(":one", n(1))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::UpdatedNew)
            .send()
            .await
            .map_err(classify)?;
        let attrs = out
            .attributes()
            .ok_or_else(|| StoreError::Corrupt("the uid counter returned nothing".into()))?;
        get_n(attrs, "taken")
    }

    fn mark_name(mark: CallMark) -> &'static str {
        match mark {
            CallMark::Started => "STARTED",
            CallMark::Finished => "FINISHED",
            CallMark::Abandoned => "ABANDONED",
        }
    }
}

#[async_trait]
impl ports::Sandboxes for SandboxStore {
    async fn get(&self, tenant: &str, agent: &str) -> Result<Option<SandboxRecord>, StoreError> {
        self.get_item(&sandbox_key(tenant, agent))
            .await?
            .as_ref()
            .map(Self::from_item)
            .transpose()
    }

    async fn list(&self, tenant: &str) -> Result<Vec<SandboxRecord>, StoreError> {
        let items: Vec<Item> = self
            .dynamo
            .query()
            .table_name(&self.table)
            .index_name("by_tenant")
            .key_condition_expression("tenant = :t")
            .expression_attribute_values(":t", s(tenant))
            .into_paginator()
            .items()
            .send()
            .collect::<Result<_, _>>()
            .await
            .map_err(classify)?;
        items.iter().map(Self::from_item).collect()
    }

    async fn list_agent(&self, agent: &str) -> Result<Vec<SandboxRecord>, StoreError> {
        let items: Vec<Item> = self
            .dynamo
            .scan()
            .table_name(&self.table)
            .filter_expression("#agent = :a AND attribute_exists(tenant)")
            .expression_attribute_names("#agent", "agent")
            .expression_attribute_values(":a", s(agent))
            .consistent_read(true)
            .into_paginator()
            .items()
            .send()
            .collect::<Result<_, _>>()
            .await
            .map_err(classify)?;
        items.iter().map(Self::from_item).collect()
    }

    async fn put_if_version(
        &self,
        rec: &SandboxRecord,
        read_version: Option<u64>,
    ) -> Result<(), StoreError> {
        let mut put = self
            .dynamo
            .put_item()
            .table_name(&self.table)
            .set_item(Some(Self::record_item(rec)));
        put = match read_version {
            Some(v) => put
                .condition_expression("version = :v")
                .expression_attribute_values(":v", n(v)),
            None => put.condition_expression("attribute_not_exists(sandbox_key)"),
        };
        put.send().await.map_err(classify)?;
        Ok(())
    }

    /// The agent's write: its report and the version, nothing else (what
    /// its credentials allow), conditional on the version it read.
    async fn put_report_if_version(
        &self,
        rec: &SandboxRecord,
        read_version: u64,
    ) -> Result<(), StoreError> {
        self.dynamo
            .update_item()
            .table_name(&self.table)
            .key("sandbox_key", s(rec.key()))
            .update_expression("SET report = :r, version = :nv")
            .condition_expression("version = :v")
            .expression_attribute_values(":r", json(&rec.report()))
            .expression_attribute_values(":nv", n(rec.version))
            .expression_attribute_values(":v", n(read_version))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }

    async fn delete(&self, rec: &SandboxRecord) -> Result<(), StoreError> {
        self.dynamo
            .delete_item()
            .table_name(&self.table)
            .key("sandbox_key", s(rec.key()))
            .condition_expression("version = :v")
            .expression_attribute_values(":v", n(rec.version))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }

    /// Puts `mark` on a call that has none; otherwise returns the mark it has.
    async fn mark_first(
        &self,
        call: &CallRef,
        mark: CallMark,
        generation: u64,
        now_ms: i64,
    ) -> Result<Option<StoredMark>, StoreError> {
        let mut item = Item::new();
        item.insert("sandbox_key".into(), s(call.key()));
        item.insert("mark".into(), s(Self::mark_name(mark)));
        item.insert("generation".into(), n(generation));
        item.insert("at".into(), n(now_ms));
        item.insert("expires_at".into(), ttl_after(now_ms, MARK_TTL_DAYS));
        match super::item::put_new(&self.dynamo, &self.table, item, "sandbox_key").await {
            Ok(()) => Ok(None),
            Err(StoreError::Conflict { .. }) => match self.get_item(&call.key()).await? {
                Some(item) => Ok(Some(Self::mark_of(&item)?)),
                // Written and gone (TTL) between the two requests: it had one.
                None => Err(StoreError::Retryable("call mark vanished".into())),
            },
            Err(e) => Err(e),
        }
    }

    /// A started call finished (its result is on its way).
    async fn mark_finished(&self, call: &CallRef, now_ms: i64) -> Result<(), StoreError> {
        self.dynamo
            .update_item()
            .table_name(&self.table)
            .key("sandbox_key", s(call.key()))
            .update_expression("SET mark = :f, #at = :now")
            .condition_expression("mark = :s")
            .expression_attribute_names("#at", "at")
            .expression_attribute_values(":f", s("FINISHED"))
            .expression_attribute_values(":s", s("STARTED"))
            .expression_attribute_values(":now", n(now_ms))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }

    async fn mark(&self, call: &CallRef) -> Result<Option<StoredMark>, StoreError> {
        self.get_item(&call.key())
            .await?
            .as_ref()
            .map(Self::mark_of)
            .transpose()
    }

    /// Takes a pooled port on `host` for `holder`; `false` if another
    /// sandbox holds it.
    async fn take_port(
        &self,
        host: &str,
        port: u16,
        holder: &str,
        generation: u64,
    ) -> Result<bool, StoreError> {
        let mut item = Item::new();
        item.insert("sandbox_key".into(), s(format!("port#{host}#{port}")));
        item.insert("holder".into(), s(holder));
        item.insert("generation".into(), n(generation));
        written(
            self.dynamo
                .put_item()
                .table_name(&self.table)
                .set_item(Some(item))
                .condition_expression("attribute_not_exists(sandbox_key) OR holder = :h")
                .expression_attribute_values(":h", s(holder))
                .send()
                .await
                .map_err(classify),
        )
    }

    /// Gives back a port `holder` holds (a no-op for anyone else's).
    async fn release_port(&self, host: &str, port: u16, holder: &str) -> Result<(), StoreError> {
        let r = self
            .dynamo
            .delete_item()
            .table_name(&self.table)
            .key("sandbox_key", s(format!("port#{host}#{port}")))
            .condition_expression("holder = :h")
            .expression_attribute_values(":h", s(holder))
            .send()
            .await
            .map_err(classify);
        match r {
            Ok(_) | Err(StoreError::Conflict { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Who holds a port, if anyone.
    async fn port_holder(&self, host: &str, port: u16) -> Result<Option<String>, StoreError> {
        Ok(self
            .get_item(&format!("port#{host}#{port}"))
            .await?
            .and_then(|i| opt_s(&i, "holder")))
    }

    /// The identity's uid item if there is one; else a uid from the
    /// counter, written if no other writer got there first (whose uid then
    /// holds, and the counted one is never used).
    async fn identity_uid(&self, tenant: &str, agent: &str) -> Result<u32, StoreError> {
        let key = uid_key(tenant, agent);
        if let Some(item) = self.get_item(&key).await? {
            return get_n(&item, "uid");
        }
        let taken = self.count_uid().await?;
        let uid = taken
            .checked_sub(1)
            .and_then(|i| u32::try_from(i).ok())
            .and_then(|i| ports::FIRST_SANDBOX_UID.checked_add(i))
            .ok_or_else(|| StoreError::Corrupt(format!("uid counter at {taken}")))?;
        let mut item = Item::new();
        item.insert("sandbox_key".into(), s(&key));
        item.insert("uid".into(), n(uid));
        match super::item::put_new(&self.dynamo, &self.table, item, "sandbox_key").await {
            Ok(()) => Ok(uid),
            Err(StoreError::Conflict { .. }) => match self.get_item(&key).await? {
                Some(item) => get_n(&item, "uid"),
                None => Err(StoreError::Retryable("uid item vanished".into())),
            },
            Err(e) => Err(e),
        }
    }
}

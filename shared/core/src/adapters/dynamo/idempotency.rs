//! The idempotency table: `Idempotency-Key` fingerprints, written in the same
//! transaction as the Run they created, expiring after a day (the keys of
//! hooks' deliveries and schedules' firings after a week).

use aws_sdk_dynamodb::types::TransactWriteItem;
use aws_sdk_dynamodb::Client;

use super::item::{get_s, n, s, ttl_after, written, Item};
use super::runs::put;
use crate::error::{classify, StoreError};
use crate::ports;

use async_trait::async_trait;

#[derive(Debug, Clone)]
pub struct IdempotencyStore {
    dynamo: Client,
    table: String,
}

pub use crate::ports::IdemRecord;

impl IdempotencyStore {
    pub fn new(dynamo: Client, table: &str) -> Self {
        IdempotencyStore {
            dynamo,
            table: table.to_string(),
        }
    }
}

fn idem_key(tenant: &str, key: &str) -> String {
    format!("{tenant}#{key}")
}

/// The record of a key, written once in the transaction creating its Run,
/// kept `keep_days` (then TTL removes it).
pub(crate) fn claim_item(
    table: &str,
    tenant: &str,
    key: &str,
    rec: &IdemRecord,
    now_ms: i64,
    keep_days: u32,
) -> TransactWriteItem {
    let mut item = Item::new();
    item.insert("idem_key".into(), s(idem_key(tenant, key)));
    item.insert("fingerprint".into(), s(&rec.fingerprint));
    item.insert("run_id".into(), s(&rec.run_id));
    item.insert("created_at".into(), n(now_ms));
    item.insert("expires_at".into(), ttl_after(now_ms, i64::from(keep_days)));
    put(table, item, "attribute_not_exists(idem_key)")
}

#[async_trait]
impl ports::Idempotency for IdempotencyStore {
    async fn get(&self, tenant: &str, key: &str) -> Result<Option<IdemRecord>, StoreError> {
        let out = self
            .dynamo
            .get_item()
            .table_name(&self.table)
            .key("idem_key", s(idem_key(tenant, key)))
            .consistent_read(true)
            .send()
            .await
            .map_err(classify)?;
        out.item()
            .map(|i| {
                Ok(IdemRecord {
                    fingerprint: get_s(i, "fingerprint")?,
                    run_id: get_s(i, "run_id")?,
                })
            })
            .transpose()
    }

    async fn count_run_start(
        &self,
        tenant: &str,
        window_s: i64,
        limit: u32,
    ) -> Result<bool, StoreError> {
        written(
            self.dynamo
                .update_item()
                .table_name(&self.table)
                .key("idem_key", s(format!("quota#runs#{tenant}#{window_s}")))
                .update_expression("ADD #n :one SET expires_at = :exp")
                .condition_expression("attribute_not_exists(#n) OR #n < :limit")
                .expression_attribute_names("#n", "started")
                .expression_attribute_values(":one", n(1))
                .expression_attribute_values(":limit", n(limit))
                // Kept a little past its minute, then TTL removes it.
                .expression_attribute_values(":exp", n(window_s + 600))
                .send()
                .await
                .map_err(classify),
        )
    }

    async fn take_slot(&self, slot: &str, holder: &str, now_ms: i64) -> Result<bool, StoreError> {
        written(
            self.dynamo
                .put_item()
                .table_name(&self.table)
                .item("idem_key", s(format!("slot#{slot}")))
                .item("holder", s(holder))
                .item("expires_at", ttl_after(now_ms, 1))
                .condition_expression("attribute_not_exists(idem_key) OR holder = :me")
                .expression_attribute_values(":me", s(holder))
                .send()
                .await
                .map_err(classify),
        )
    }
}

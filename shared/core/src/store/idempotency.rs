//! The idempotency table: `Idempotency-Key` fingerprints, written in the same
//! transaction as the Run they created, expiring after a day.

use aws_sdk_dynamodb::types::TransactWriteItem;
use aws_sdk_dynamodb::Client;

use super::item::{get_s, n, s, ttl_after, Item};
use super::runs::put;
use crate::error::{classify, StoreError};

const TTL_DAYS: i64 = 1;

#[derive(Debug, Clone)]
pub struct IdempotencyStore {
    dynamo: Client,
    table: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdemRecord {
    pub fingerprint: String,
    pub run_id: String,
}

impl IdempotencyStore {
    pub fn new(dynamo: Client, table: &str) -> Self {
        IdempotencyStore {
            dynamo,
            table: table.to_string(),
        }
    }

    fn key(tenant: &str, key: &str) -> String {
        format!("{tenant}#{key}")
    }

    pub fn claim_item(
        &self,
        tenant: &str,
        key: &str,
        rec: &IdemRecord,
        now_ms: i64,
    ) -> TransactWriteItem {
        let mut item = Item::new();
        item.insert("idem_key".into(), s(Self::key(tenant, key)));
        item.insert("fingerprint".into(), s(&rec.fingerprint));
        item.insert("run_id".into(), s(&rec.run_id));
        item.insert("created_at".into(), n(now_ms));
        item.insert("expires_at".into(), ttl_after(now_ms, TTL_DAYS));
        put(&self.table, item, "attribute_not_exists(idem_key)")
    }

    pub async fn get(&self, tenant: &str, key: &str) -> Result<Option<IdemRecord>, StoreError> {
        let out = self
            .dynamo
            .get_item()
            .table_name(&self.table)
            .key("idem_key", s(Self::key(tenant, key)))
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
}

//! The quotas table: what each tenant holds at once, one partition per
//! tenant and kind (`pk`), one item per holding (`sk`), every item with an
//! expiry (`expires_at`, seconds: DynamoDB's TTL removes it some time
//! after, and reads ignore it from then on).
//!
//! - `active#<tenant>` / run id: a Run the tenant started through the API
//!   and that was not settled yet, written in the transaction creating it.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, Select, TransactWriteItem};
use aws_sdk_dynamodb::Client;

use super::item::{n, s, Item};
use super::runs::put;
use crate::error::{classify, StoreError};
use crate::ports;

#[derive(Debug, Clone)]
pub struct QuotasStore {
    dynamo: Client,
    table: String,
}

impl QuotasStore {
    pub fn new(dynamo: Client, table: &str) -> Self {
        QuotasStore {
            dynamo,
            table: table.to_string(),
        }
    }
}

fn active_pk(tenant: &str) -> String {
    format!("active#{tenant}")
}

/// An expiry as the TTL attribute holds it: seconds, rounded up.
fn expiry_s(ms: i64) -> AttributeValue {
    n(ms.div_euclid(1000) + 1)
}

/// The marker of an active Run, written once with its creation.
pub(crate) fn active_item(
    table: &str,
    tenant: &str,
    run_id: &str,
    until_ms: i64,
) -> TransactWriteItem {
    let mut item = Item::new();
    item.insert("pk".into(), s(active_pk(tenant)));
    item.insert("sk".into(), s(run_id));
    item.insert("expires_at".into(), expiry_s(until_ms));
    put(table, item, "attribute_not_exists(sk)")
}

#[async_trait]
impl ports::Quotas for QuotasStore {
    async fn active_runs(&self, tenant: &str, limit: u32, now_ms: i64) -> Result<u32, StoreError> {
        let mut counted = 0u32;
        let mut start = None;
        // Page by page, reading no more items than are still needed to
        // reach the limit (an expired one read in a page is not counted).
        while counted < limit {
            let out = self
                .dynamo
                .query()
                .table_name(&self.table)
                .key_condition_expression("pk = :pk")
                .filter_expression("expires_at > :now")
                .expression_attribute_values(":pk", s(active_pk(tenant)))
                .expression_attribute_values(":now", n(now_ms.div_euclid(1000)))
                .select(Select::Count)
                .limit(i32::try_from(limit - counted).unwrap_or(i32::MAX))
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(classify)?;
            counted += u32::try_from(out.count()).unwrap_or(0);
            start = out.last_evaluated_key().cloned();
            if start.is_none() {
                break;
            }
        }
        Ok(counted.min(limit))
    }

    async fn run_ended(&self, tenant: &str, run_id: &str) -> Result<(), StoreError> {
        self.dynamo
            .delete_item()
            .table_name(&self.table)
            .key("pk", s(active_pk(tenant)))
            .key("sk", s(run_id))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }
}

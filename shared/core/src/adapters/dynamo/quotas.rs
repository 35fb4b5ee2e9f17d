//! The quotas table: what each tenant holds at once, one partition per
//! tenant and kind (`pk`), one item per holding (`sk`), every item with an
//! expiry (`expires_at`, seconds: DynamoDB's TTL removes it some time
//! after, and reads ignore it from then on).
//!
//! - `active#<tenant>` / run id: a Run the tenant started through the API
//!   (or the running step of such a chain) and that was not settled yet,
//!   written in the transaction creating it.
//! - `polls#<tenant>` / slot number: a long-poll waiting, from 0 to the
//!   limit less one, taken by a conditional put (absent, or its holder's
//!   time passed) and deleted by its holder when the poll ends.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, Select, TransactWriteItem};
use aws_sdk_dynamodb::Client;

use super::item::{get_n, get_s, n, s, written, Item};
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

fn polls_pk(tenant: &str) -> String {
    format!("polls#{tenant}")
}

/// Slot numbers as sort keys: fixed width, so they sort as numbers.
fn slot_sk(slot: u32) -> String {
    format!("{slot:05}")
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

    async fn take_poll_slot(
        &self,
        tenant: &str,
        limit: u32,
        holder: &str,
        now_ms: i64,
        until_ms: i64,
    ) -> Result<Option<u32>, StoreError> {
        // One read says which slots look free; each is then tried with a
        // conditional put, which decides between pollers racing for it.
        let mut held = std::collections::BTreeSet::new();
        let mut start = None;
        loop {
            let out = self
                .dynamo
                .query()
                .table_name(&self.table)
                .key_condition_expression("pk = :pk")
                .expression_attribute_values(":pk", s(polls_pk(tenant)))
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(classify)?;
            for item in out.items() {
                let until: i64 = get_n(item, "until_ms")?;
                if until > now_ms {
                    held.insert(get_s(item, "sk")?);
                }
            }
            start = out.last_evaluated_key().cloned();
            if start.is_none() {
                break;
            }
        }
        let free: Vec<u32> = (0..limit)
            .filter(|i| !held.contains(&slot_sk(*i)))
            .collect();
        if free.is_empty() {
            return Ok(None);
        }
        // From a random one on, so pollers arriving together try
        // different slots first.
        let first = rand::random::<usize>() % free.len();
        for slot in free[first..].iter().chain(&free[..first]) {
            let mut item = Item::new();
            item.insert("pk".into(), s(polls_pk(tenant)));
            item.insert("sk".into(), s(slot_sk(*slot)));
            item.insert("holder".into(), s(holder));
            item.insert("until_ms".into(), n(until_ms));
            item.insert("expires_at".into(), expiry_s(until_ms));
            let taken = written(
                self.dynamo
                    .put_item()
                    .table_name(&self.table)
                    .set_item(Some(item))
                    .condition_expression("attribute_not_exists(sk) OR until_ms <= :now")
                    .expression_attribute_values(":now", n(now_ms))
                    .send()
                    .await
                    .map_err(classify),
            )?;
            if taken {
                return Ok(Some(*slot));
            }
        }
        Ok(None)
    }

    async fn release_poll_slot(
        &self,
        tenant: &str,
        slot: u32,
        holder: &str,
    ) -> Result<(), StoreError> {
        written(
            self.dynamo
                .delete_item()
                .table_name(&self.table)
                .key("pk", s(polls_pk(tenant)))
                .key("sk", s(slot_sk(slot)))
                .condition_expression("holder = :me")
                .expression_attribute_values(":me", s(holder))
                .send()
                .await
                .map_err(classify),
        )?;
        Ok(())
    }
}

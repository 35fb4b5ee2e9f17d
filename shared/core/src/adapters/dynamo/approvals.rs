//! The approvals table: one item per gated tool call. It is created with
//! the commit that parks its Run ([`Also::Approval`](crate::ports::Also)),
//! and every later write (a link minted, a decision, an expiry, a cancel)
//! is conditional on the version the writer read: two deciders of one
//! approval never both win. `tenant` and `created_at` feed the `by_tenant`
//! index (GET /v1/approvals), `run_id` the `by_run` index (the watchdog,
//! a cancel); the record itself is a JSON document.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{Put, TransactWriteItem};
use aws_sdk_dynamodb::Client;

use armada_domain::approval::{Approval, ApprovalState};

use super::item::{get_json, json, n, s, Item};
use crate::error::{classify, StoreError};
use crate::ports::Approvals;

/// How long a record outlives its deadline (the audit trail stays in the
/// Run's events).
const KEEP_DAYS: i64 = 30;

#[derive(Debug, Clone)]
pub struct ApprovalStore {
    dynamo: Client,
    table: String,
}

impl ApprovalStore {
    pub fn new(dynamo: Client, table: &str) -> Self {
        ApprovalStore {
            dynamo,
            table: table.to_string(),
        }
    }

    pub fn item(a: &Approval) -> Item {
        let mut item = Item::new();
        item.insert("approval_id".into(), s(&a.approval_id));
        item.insert("tenant".into(), s(&a.tenant));
        item.insert("run_id".into(), s(&a.run_id));
        item.insert("state".into(), s(a.state().as_str()));
        item.insert("created_at".into(), n(a.created_at_ms));
        item.insert("version".into(), n(a.version));
        item.insert(
            "purge_at".into(),
            n(a.expires_at_ms / 1000 + KEEP_DAYS * 86_400),
        );
        item.insert("doc".into(), json(a));
        item
    }

    fn from_item(item: &Item) -> Result<Approval, StoreError> {
        get_json(item, "doc")
    }

    /// The transaction item that creates `a` once, with its Run's commit.
    pub fn create_item(table: &str, a: &Approval) -> TransactWriteItem {
        let put = Put::builder()
            .table_name(table)
            .set_item(Some(Self::item(a)))
            .condition_expression("attribute_not_exists(approval_id)")
            .build();
        // The builder fails only without table or item, both set above.
        TransactWriteItem::builder().set_put(put.ok()).build()
    }

    async fn query(
        &self,
        index: &str,
        key: &str,
        value: &str,
        newest_first: bool,
        state: Option<ApprovalState>,
        limit: usize,
    ) -> Result<Vec<Approval>, StoreError> {
        let mut q = self
            .dynamo
            .query()
            .table_name(&self.table)
            .index_name(index)
            .key_condition_expression("#k = :v")
            .expression_attribute_names("#k", key)
            .expression_attribute_values(":v", s(value))
            .scan_index_forward(!newest_first);
        if let Some(st) = state {
            q = q
                .filter_expression("#st = :st")
                .expression_attribute_names("#st", "state")
                .expression_attribute_values(":st", s(st.as_str()));
        }
        let mut out = Vec::new();
        let mut pages = q.into_paginator().send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(classify)?;
            for item in page.items() {
                out.push(Self::from_item(item)?);
                if out.len() >= limit {
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl Approvals for ApprovalStore {
    async fn get(&self, approval_id: &str) -> Result<Option<Approval>, StoreError> {
        let out = self
            .dynamo
            .get_item()
            .table_name(&self.table)
            .key("approval_id", s(approval_id))
            .consistent_read(true)
            .send()
            .await
            .map_err(classify)?;
        out.item().map(Self::from_item).transpose()
    }

    async fn update(&self, prev_version: u64, approval: &Approval) -> Result<(), StoreError> {
        self.dynamo
            .put_item()
            .table_name(&self.table)
            .set_item(Some(Self::item(approval)))
            .condition_expression("attribute_exists(approval_id) AND version = :v")
            .expression_attribute_values(":v", n(prev_version))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }

    async fn of_run(&self, run_id: &str) -> Result<Vec<Approval>, StoreError> {
        // The index is eventually consistent: each is read again, strongly.
        let listed = self
            .query("by_run", "run_id", run_id, false, None, usize::MAX)
            .await?;
        let mut out = Vec::with_capacity(listed.len());
        for a in listed {
            if let Some(fresh) = self.get(&a.approval_id).await? {
                out.push(fresh);
            }
        }
        Ok(out)
    }

    async fn of_tenant(
        &self,
        tenant: &str,
        state: Option<ApprovalState>,
        limit: usize,
    ) -> Result<Vec<Approval>, StoreError> {
        self.query("by_tenant", "tenant", tenant, true, state, limit)
            .await
    }
}

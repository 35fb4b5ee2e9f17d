//! The triggers table: what starts Runs without an API key. One
//! partition per hook (`pk = hook#<id>`): the hook itself (`sk = hook`), its
//! answered deliveries (`sk = delivery#<received at>#<id>`, newest last,
//! kept 30 days) and its hourly start counters (`sk = count#<hour>`); one
//! per schedule (`pk = schedule#<id>`): the schedule (`sk = schedule`) and
//! its firings (`sk = firing#<scheduled at>`, one per time, kept 30 days).
//! Hooks and schedules carry `list_key = <kind>#<tenant>` and `created_at`
//! for the `by_owner` index (their lists); nothing else does. Every write
//! of a hook or schedule after creation is conditional on the version its
//! writer read.

use aws_sdk_dynamodb::Client;

use super::item::get_json;
use crate::error::{classify, StoreError};

mod hooks;
mod schedules;

/// How long a hook's answered delivery or a schedule's firing is kept.
const KEEP_DAYS: i64 = 30;

#[derive(Debug, Clone)]
pub struct TriggerStore {
    dynamo: Client,
    table: String,
}

impl TriggerStore {
    pub fn new(dynamo: Client, table: &str) -> Self {
        TriggerStore {
            dynamo,
            table: table.to_string(),
        }
    }

    /// Reads every page of a query, as documents in `doc`, up to `limit`.
    pub(super) async fn documents<T: serde::de::DeserializeOwned>(
        &self,
        query: aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder,
        limit: usize,
    ) -> Result<Vec<T>, StoreError> {
        let mut out = Vec::new();
        let mut pages = query.into_paginator().send();
        while let Some(page) = pages.next().await {
            for item in page.map_err(classify)?.items() {
                out.push(get_json(item, "doc")?);
                if out.len() >= limit {
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }
}

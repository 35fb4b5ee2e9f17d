//! What the SDK interceptor sees of every AWS call: a count per
//! `Service.Operation`, and, while a log is on (`armada bench`), each call
//! with its start and end and the Runs it was made for, so the bench can
//! sum, Run by Run, the time the emulator spent on the very calls of the
//! measured path. A call is for the Runs its request (or, for a receive,
//! its response) names, else for those the handler that made it works for
//! ([`on_behalf`], [`name_run`]: a task-local that costs nothing else).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::{
    AfterDeserializationInterceptorContextRef, BeforeSerializationInterceptorContextRef,
    BeforeTransmitInterceptorContextRef, FinalizerInterceptorContextRef,
};
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::{ConfigBag, Storable, StoreReplace};

use armada_domain::run::TERMINAL_EVENTS;

/// The Runs a piece of work is done for, named as they become known (an
/// API request learns its Run's id only after authenticating).
#[derive(Debug, Clone, Default)]
pub struct OnBehalf(Arc<Mutex<Vec<String>>>);

impl OnBehalf {
    fn add(&self, run_id: &str) {
        if let Ok(mut ids) = self.0.lock() {
            if !ids.iter().any(|i| i == run_id) {
                ids.push(run_id.to_string());
            }
        }
    }

    fn ids(&self) -> Vec<String> {
        self.0.lock().map(|ids| ids.clone()).unwrap_or_default()
    }
}

tokio::task_local! {
    static ON_BEHALF: OnBehalf;
}

/// Runs `work` on behalf of `run_id` (if known yet): the AWS calls it
/// makes are that Run's in the call log.
pub async fn on_behalf<F: std::future::Future>(run_id: Option<&str>, work: F) -> F::Output {
    let cell = OnBehalf::default();
    if let Some(id) = run_id {
        cell.add(id);
    }
    ON_BEHALF.scope(cell, work).await
}

/// Names the Run the current work turned out to be for.
pub fn name_run(run_id: &str) {
    let _ = ON_BEHALF.try_with(|c| c.add(run_id));
}

/// One AWS call as the interceptor saw it.
#[derive(Debug, Clone)]
pub struct CallRecord {
    /// `Service.Operation`.
    pub op: String,
    pub start: Instant,
    /// When the response was handled (`None`: not yet, or it never came).
    pub end: Option<Instant>,
    /// The Runs its request names (or, for a receive, its response).
    pub runs: Vec<String>,
    /// The sessions its request names.
    pub sessions: Vec<String>,
    /// The commit that ends a Run (a transaction with a terminal event).
    pub terminal: bool,
    /// The work the call was made in, for calls naming no Run.
    behalf: Option<OnBehalf>,
    /// The Runs of the work it was made in (the handler's message, the
    /// request), filled in by [`CallCounter::drain_log`].
    pub on_behalf: Vec<String>,
}

impl CallRecord {
    /// A call that names `runs` and no session.
    pub fn new(op: &str, start: Instant, end: Option<Instant>, runs: Vec<String>) -> Self {
        CallRecord {
            op: op.to_string(),
            start,
            end,
            runs,
            sessions: Vec::new(),
            terminal: false,
            behalf: None,
            on_behalf: Vec::new(),
        }
    }

    pub fn millis(&self) -> f64 {
        self.end
            .map_or(0.0, |e| e.duration_since(self.start).as_secs_f64() * 1000.0)
    }
}

/// The index of the call in the log, kept in the call's own config bag.
#[derive(Debug, Clone, Copy)]
struct LogIndex(usize);

impl Storable for LogIndex {
    type Storer = StoreReplace<Self>;
}

/// Counts AWS API calls by `Service.Operation`, and can record them.
#[derive(Debug, Clone, Default)]
pub struct CallCounter(
    Arc<Mutex<BTreeMap<String, u64>>>,
    Arc<Mutex<Option<Vec<CallRecord>>>>,
);

impl CallCounter {
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.0.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// Starts recording calls (replacing any earlier record).
    pub fn start_log(&self) {
        if let Ok(mut l) = self.1.lock() {
            *l = Some(Vec::new());
        }
    }

    /// The calls recorded since [`Self::start_log`], which goes on.
    pub fn drain_log(&self) -> Vec<CallRecord> {
        let mut log = self
            .1
            .lock()
            .ok()
            .and_then(|mut l| l.as_mut().map(std::mem::take))
            .unwrap_or_default();
        for c in &mut log {
            if let Some(b) = c.behalf.take() {
                c.on_behalf = b.ids();
                if c.runs.is_empty() {
                    c.runs = c.on_behalf.clone();
                }
            }
        }
        log
    }

    /// Stops recording and returns the operations since [`Self::start_log`].
    pub fn take_log(&self) -> Vec<String> {
        self.1
            .lock()
            .ok()
            .and_then(|mut l| l.take())
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.op)
            .collect()
    }

    pub fn total(&self) -> u64 {
        self.snapshot().values().sum()
    }

    pub fn reset(&self) {
        if let Ok(mut m) = self.0.lock() {
            m.clear();
        }
    }

    fn with_record(&self, cfg: &ConfigBag, f: impl FnOnce(&mut CallRecord)) {
        let Some(LogIndex(i)) = cfg.load::<LogIndex>().copied() else {
            return;
        };
        if let Ok(mut l) = self.1.lock() {
            if let Some(rec) = l.as_mut().and_then(|log| log.get_mut(i)) {
                f(rec);
            }
        }
    }
}

/// The Run ids (`run_` and 32 hex digits) in a body, once each.
fn run_ids(body: &[u8]) -> Vec<String> {
    ids(body, b"run_")
}

/// The ids with `prefix` (four bytes) and 32 hex digits in a body, once each.
fn ids(body: &[u8], prefix: &[u8; 4]) -> Vec<String> {
    const ID: usize = 4 + 32;
    let mut found: Vec<String> = Vec::new();
    let mut i = 0;
    while i + ID <= body.len() {
        if &body[i..i + 4] == prefix && body[i + 4..i + ID].iter().all(u8::is_ascii_hexdigit) {
            let id = String::from_utf8_lossy(&body[i..i + ID]).into_owned();
            if !found.contains(&id) {
                found.push(id);
            }
            i += ID;
        } else {
            i += 1;
        }
    }
    found
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

impl Intercept for CallCounter {
    fn name(&self) -> &'static str {
        "CallCounter"
    }

    fn read_before_serialization(
        &self,
        _context: &BeforeSerializationInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(meta) = cfg.load::<Metadata>() else {
            return Ok(());
        };
        let key = format!("{}.{}", meta.service(), meta.name());
        let mut index = None;
        if let Ok(mut l) = self.1.lock() {
            if let Some(log) = l.as_mut() {
                index = Some(log.len());
                log.push(CallRecord {
                    op: key.clone(),
                    start: Instant::now(),
                    end: None,
                    runs: Vec::new(),
                    sessions: Vec::new(),
                    terminal: false,
                    behalf: ON_BEHALF.try_with(OnBehalf::clone).ok(),
                    on_behalf: Vec::new(),
                });
            }
        }
        if let Some(i) = index {
            cfg.interceptor_state().store_put(LogIndex(i));
        }
        if let Ok(mut m) = self.0.lock() {
            *m.entry(key).or_insert(0) += 1;
        }
        Ok(())
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(body) = context.request().body().bytes() else {
            return Ok(());
        };
        self.with_record(cfg, |rec| {
            rec.runs = run_ids(body);
            rec.sessions = ids(body, b"ses_");
            rec.terminal = rec.op.ends_with("TransactWriteItems")
                && TERMINAL_EVENTS
                    .iter()
                    .any(|t| contains(body, t.as_str().as_bytes()));
        });
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(body) = context.response().body().bytes() else {
            return Ok(());
        };
        self.with_record(cfg, |rec| {
            if rec.op.ends_with("ReceiveMessage") {
                rec.runs = run_ids(body);
            }
        });
        Ok(())
    }

    fn read_after_execution(
        &self,
        _context: &FinalizerInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        self.with_record(cfg, |rec| rec.end = Some(Instant::now()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_found_escaped_or_not_once_each() {
        let id = format!("run_{}", "0a".repeat(16));
        let body =
            format!(r#"{{"Key":{{"S":"{id}"}},"b":"{{\"run_id\":\"{id}\"}}","c":"run_xyz"}}"#);
        assert_eq!(run_ids(body.as_bytes()), [id]);
        assert!(run_ids(b"run_").is_empty());
    }
}

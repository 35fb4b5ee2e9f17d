//! `armada runs tree`: a Run's DelegationTrace (`GET /v1/runs/{id}/trace`)
//! drawn as a tree, one line per Run: id, agent, kind, state and how long
//! it took (or has been running). A chain's steps are peers, drawn one
//! after another at the top.

use std::collections::HashMap;

use serde_json::Value;

use armada_core::clock::parse_rfc3339;

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// How long a Run took: ended − created, or "running" when it has not
/// ended.
fn took(run: &Value) -> String {
    let created = parse_rfc3339(s(&run["created_at"]));
    let ended = parse_rfc3339(s(&run["ended_at"]));
    match (created, ended) {
        (Some(c), Some(e)) => format!("{:.1}s", (e - c).max(0) as f64 / 1000.0),
        _ => "running".to_string(),
    }
}

fn line(run: &Value) -> String {
    let mut text = format!(
        "{}  {}  {}  {}  {}",
        s(&run["run_id"]),
        s(&run["agent"]),
        s(&run["kind"]),
        s(&run["state"]),
        took(run)
    );
    if let Some(n) = run["outstanding_children"].as_u64().filter(|n| *n > 0) {
        text.push_str(&format!("  (waiting for {n})"));
    }
    text
}

/// The trace as lines of text.
pub fn draw(trace: &Value) -> String {
    let runs: Vec<&Value> = trace["runs"]
        .as_array()
        .map(|r| r.iter().collect())
        .unwrap_or_default();
    let mut children: HashMap<&str, Vec<&Value>> = HashMap::new();
    let mut tops = Vec::new();
    for r in &runs {
        match r["parent_run_id"].as_str() {
            Some(p) if runs.iter().any(|x| s(&x["run_id"]) == p) => {
                children.entry(p).or_default().push(r)
            }
            _ => tops.push(*r),
        }
    }
    let mut out = String::new();
    for top in tops {
        out.push_str(&line(top));
        out.push('\n');
        below(top, &children, "", &mut out);
    }
    if trace["truncated"].as_bool() == Some(true) {
        out.push_str("… (truncated)\n");
    }
    out
}

fn below(run: &Value, children: &HashMap<&str, Vec<&Value>>, indent: &str, out: &mut String) {
    let kids = children.get(s(&run["run_id"])).cloned().unwrap_or_default();
    for (i, kid) in kids.iter().enumerate() {
        let last = i + 1 == kids.len();
        out.push_str(indent);
        out.push_str(if last { "└─ " } else { "├─ " });
        out.push_str(&line(kid));
        out.push('\n');
        let deeper = format!("{indent}{}", if last { "   " } else { "│  " });
        below(kid, children, &deeper, out);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_tree_draws_children_under_their_parents_with_states_and_timings() {
        let run = |id: &str,
                   parent: Option<&str>,
                   agent: &str,
                   kind: &str,
                   state: &str,
                   ended: Option<&str>| {
            json!({"run_id": id, "parent_run_id": parent, "agent": agent, "kind": kind, "state": state,
                   "created_at": "2026-12-04T10:00:00.000Z", "ended_at": ended, "outstanding_children": 0})
        };
        let trace = json!({"root_run_id": "r", "runs": [
            run("r", None, "boss", "root", "COMPLETED", Some("2026-12-04T10:00:02.500Z")),
            run("a", Some("r"), "helper", "delegation", "COMPLETED", Some("2026-12-04T10:00:01.000Z")),
            run("b", Some("r"), "other", "delegation", "EXECUTING", None),
            run("c", Some("a"), "leaf", "delegation", "FAILED", Some("2026-12-04T10:00:00.250Z")),
        ]});
        let text = draw(&trace);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "r  boss  root  COMPLETED  2.5s");
        assert_eq!(lines[1], "├─ a  helper  delegation  COMPLETED  1.0s");
        assert_eq!(lines[2], "│  └─ c  leaf  delegation  FAILED  0.2s");
        assert_eq!(lines[3], "└─ b  other  delegation  EXECUTING  running");
    }
}

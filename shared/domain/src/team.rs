//! Teams as registry data (scenarios D, E and G of seed 000): who the
//! members are, how they work together (`fan_out`, `relay`, `lead`), who
//! aggregates or leads, what a failing member means, and how many run at
//! once. Only the definition lives here; how a team's Run expands is the
//! dispatcher's (issue 8, next slices).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::fields::{FieldError, Fields};
use crate::names::valid_name;

/// The fields of a team's definition (`name` is what a `GET` adds: the
/// path's, accepted and ignored).
pub const TEAM_FIELDS: [&str; 7] = [
    "name",
    "members",
    "strategy",
    "aggregator",
    "lead",
    "failure_policy",
    "max_parallel",
];

/// The most members a team may have.
pub const MAX_MEMBERS: usize = 64;
/// Members running at once unless the team says otherwise.
pub const DEFAULT_MAX_PARALLEL: u32 = 16;

/// How a team's members work together.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Every member answers in parallel; the aggregator answers over them.
    FanOut,
    /// Members one after another, each given the previous one's output.
    Relay,
    /// The lead plans tasks for members, then consolidates their outcomes.
    Lead,
}

impl Strategy {
    fn parse(s: &str) -> Option<Strategy> {
        match s {
            "fan_out" => Some(Strategy::FanOut),
            "relay" => Some(Strategy::Relay),
            "lead" => Some(Strategy::Lead),
            _ => None,
        }
    }
}

/// What the team's Run does when members fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailurePolicy {
    /// Any failed member fails the team's Run, naming it.
    All,
    /// Aggregate whatever finished, listing the failed.
    BestEffort,
    /// Needs at least this many successes.
    Quorum(u32),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TeamDefinition {
    pub name: String,
    pub members: Vec<String>,
    pub strategy: Strategy,
    /// Who answers over the members (fan-out); `None`: the first member.
    pub aggregator: Option<String>,
    /// Who plans and consolidates (strategy `lead`).
    pub lead: Option<String>,
    pub failure_policy: FailurePolicy,
    pub max_parallel: u32,
}

impl TeamDefinition {
    /// Parses and validates a definition; `name` comes from the path.
    pub fn from_json(name: &str, body: &Value) -> Result<Self, FieldError> {
        if !valid_name(name) {
            return Err(FieldError::new(
                "name",
                "must be 1-64 characters of a-z, 0-9, '-' or '_'",
            ));
        }
        let f = Fields::new(body)?;
        f.only(&TEAM_FIELDS)?;
        let members = f
            .opt_str_list("members")?
            .ok_or_else(|| FieldError::new("members", "is required"))?;
        if members.is_empty() || members.len() > MAX_MEMBERS {
            return Err(FieldError::new(
                "members",
                &format!("must name between 1 and {MAX_MEMBERS} agents"),
            ));
        }
        for (i, m) in members.iter().enumerate() {
            let field = format!("members[{i}]");
            if !valid_name(m) {
                return Err(FieldError::new(&field, "is not a valid agent name"));
            }
            if members[..i].contains(m) {
                return Err(FieldError::new(&field, &format!("'{m}' is listed twice")));
            }
        }
        let strategy = Strategy::parse(f.req_str("strategy")?)
            .ok_or_else(|| FieldError::new("strategy", "must be one of fan_out, relay, lead"))?;
        let agent = |key: &str| -> Result<Option<String>, FieldError> {
            match f.opt_str(key)? {
                Some(a) if !valid_name(a) => Err(FieldError::new(key, "is not a valid agent name")),
                other => Ok(other.map(str::to_string)),
            }
        };
        let aggregator = agent("aggregator")?;
        let lead = agent("lead")?;
        if strategy == Strategy::Lead && lead.is_none() {
            return Err(FieldError::new("lead", "is required for strategy lead"));
        }
        let failure_policy = parse_policy(body.get("failure_policy"), members.len())?;
        let max_parallel = match f.opt_u64("max_parallel")? {
            None => DEFAULT_MAX_PARALLEL,
            Some(n) if (1..=MAX_MEMBERS as u64).contains(&n) => n as u32,
            Some(_) => {
                return Err(FieldError::new(
                    "max_parallel",
                    &format!("must be between 1 and {MAX_MEMBERS}"),
                ))
            }
        };
        Ok(TeamDefinition {
            name: name.to_string(),
            members,
            strategy,
            aggregator,
            lead,
            failure_policy,
            max_parallel,
        })
    }

    /// Who answers over the members: the aggregator, else the first member.
    pub fn aggregator(&self) -> &str {
        self.aggregator.as_deref().unwrap_or(&self.members[0])
    }

    /// Every agent the team names (members, aggregator, lead), once each.
    pub fn agents(&self) -> Vec<&str> {
        let mut all: Vec<&str> = self.members.iter().map(String::as_str).collect();
        for a in [self.aggregator.as_deref(), self.lead.as_deref()]
            .into_iter()
            .flatten()
        {
            if !all.contains(&a) {
                all.push(a);
            }
        }
        all
    }
}

fn parse_policy(v: Option<&Value>, members: usize) -> Result<FailurePolicy, FieldError> {
    let bad = || {
        FieldError::new(
            "failure_policy",
            "must be \"all\", \"best_effort\" or {\"quorum\": n}",
        )
    };
    match v {
        None | Some(Value::Null) => Ok(FailurePolicy::All),
        Some(Value::String(s)) if s == "all" => Ok(FailurePolicy::All),
        Some(Value::String(s)) if s == "best_effort" => Ok(FailurePolicy::BestEffort),
        Some(Value::Object(o)) => {
            let q = Fields::nested(o, "failure_policy")?;
            q.only(&["quorum"])?;
            let n = q.req_u64("quorum")?;
            if n == 0 || n > members as u64 {
                return Err(FieldError::new(
                    "failure_policy.quorum",
                    &format!("must be between 1 and the {members} members"),
                ));
            }
            Ok(FailurePolicy::Quorum(n as u32))
        }
        Some(_) => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_minimal_team_fans_out_to_all_and_the_first_member_aggregates() {
        let t = TeamDefinition::from_json(
            "soc",
            &json!({"members": ["triage", "intel"], "strategy": "fan_out"}),
        )
        .unwrap();
        assert_eq!(t.failure_policy, FailurePolicy::All);
        assert_eq!(t.max_parallel, DEFAULT_MAX_PARALLEL);
        assert_eq!(t.aggregator(), "triage");
        assert_eq!(t.agents(), ["triage", "intel"]);
    }

    #[test]
    fn every_rule_names_its_field() {
        let cases = [
            (json!({"strategy": "fan_out"}), "members"),
            (json!({"members": [], "strategy": "fan_out"}), "members"),
            (
                json!({"members": ["a", "a"], "strategy": "relay"}),
                "members[1]",
            ),
            (
                json!({"members": ["A b"], "strategy": "relay"}),
                "members[0]",
            ),
            (json!({"members": ["a"], "strategy": "vote"}), "strategy"),
            (json!({"members": ["a"], "strategy": "lead"}), "lead"),
            (
                json!({"members": ["a"], "strategy": "fan_out", "failure_policy": {"quorum": 2}}),
                "failure_policy.quorum",
            ),
            (
                json!({"members": ["a"], "strategy": "fan_out", "failure_policy": "most"}),
                "failure_policy",
            ),
            (
                json!({"members": ["a"], "strategy": "fan_out", "failure_policy": {"quorom": 1}}),
                "failure_policy.quorom",
            ),
            (
                json!({"members": ["a"], "strategy": "fan_out", "leader": "a"}),
                "leader",
            ),
            (
                json!({"members": ["a"], "strategy": "fan_out", "max_parallel": 0}),
                "max_parallel",
            ),
            (
                json!({"members": ["a"], "strategy": "fan_out", "extra": 1}),
                "extra",
            ),
        ];
        for (body, field) in cases {
            let e = TeamDefinition::from_json("t", &body).unwrap_err();
            assert_eq!(e.field, field, "{body}");
        }
        let many: Vec<String> = (0..=MAX_MEMBERS).map(|i| format!("m{i}")).collect();
        let e = TeamDefinition::from_json("t", &json!({"members": many, "strategy": "fan_out"}))
            .unwrap_err();
        assert_eq!(e.field, "members");
    }

    #[test]
    fn a_lead_team_and_a_quorum_round_trip_through_json() {
        let t = TeamDefinition::from_json(
            "ops",
            &json!({"members": ["a", "b", "c"], "strategy": "lead", "lead": "boss",
                    "failure_policy": {"quorum": 2}, "max_parallel": 2}),
        )
        .unwrap();
        assert_eq!(t.agents(), ["a", "b", "c", "boss"]);
        let back: TeamDefinition =
            serde_json::from_value(serde_json::to_value(&t).unwrap()).unwrap();
        assert_eq!(back, t);
    }
}

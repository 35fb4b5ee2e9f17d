//! A hook's input template: what a delivery's Run is asked, rendered by
//! MiniJinja (Jinja2's language) over `{event, payload, hook}`. Names that
//! are not there are errors, not blanks, and a template is run with a
//! bounded amount of fuel: a tenant's template cannot stall ingress.

use minijinja::{Environment, UndefinedBehavior};
use serde::Serialize;
use serde_json::Value;

use crate::hook::HookKind;

/// The longest template a hook may have.
pub const MAX_TEMPLATE_CHARS: usize = 16 * 1024;

/// How much work one rendering may do (MiniJinja's instruction fuel): far
/// more than any template of [`MAX_TEMPLATE_CHARS`] needs over a 1 MiB
/// payload without a runaway loop.
const FUEL: u64 = 2_000_000;

/// Why a template does not compile or render: MiniJinja's own words,
/// with the line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TemplateError(pub String);

/// What a template sees.
#[derive(Debug, Clone, Serialize)]
pub struct Context<'a> {
    /// The event's name (`push`, `pull_request`, `firing`, a Standard
    /// Webhooks payload's `type`).
    pub event: &'a str,
    /// The delivery's body, parsed.
    pub payload: &'a Value,
    pub hook: HookContext<'a>,
}

#[derive(Debug, Clone, Serialize)]
pub struct HookContext<'a> {
    pub hook_id: &'a str,
    pub kind: HookKind,
}

/// The template of a hook that gives none: the event, what it is about,
/// and the payload.
pub fn default_template(kind: HookKind) -> &'static str {
    match kind {
        HookKind::Github => concat!(
            "GitHub sent a {{ event }} event",
            "{% if payload.repository is defined and payload.repository.full_name is defined %}",
            " for {{ payload.repository.full_name }}{% endif %}.\n\n",
            "Payload:\n{{ payload | tojson(indent=2) }}\n",
        ),
        HookKind::Standard => concat!(
            "Webhook event: {{ event }}.\n\n",
            "Payload:\n{{ payload | tojson(indent=2) }}\n",
        ),
        HookKind::Cloudwatch => concat!(
            "CloudWatch alarm {{ payload.AlarmName | default('(unnamed)') }} is ",
            "{{ payload.NewStateValue | default(event) }}",
            "{% if payload.NewStateReason is defined and payload.NewStateReason %}: ",
            "{{ payload.NewStateReason }}{% endif %}.\n\n",
            "Payload:\n{{ payload | tojson(indent=2) }}\n",
        ),
        HookKind::Alertmanager => concat!(
            "Alertmanager reports {{ payload.status | default('an update') }}",
            "{% if payload.commonLabels is defined and payload.commonLabels.alertname is defined %}",
            " for {{ payload.commonLabels.alertname }}{% endif %}",
            "{% if payload.alerts is defined %} ({{ payload.alerts | length }} alerts){% endif %}.\n\n",
            "Payload:\n{{ payload | tojson(indent=2) }}\n",
        ),
    }
}

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_fuel(Some(FUEL));
    env
}

/// Whether `source` is a template that compiles (its error, naming the
/// line, when not).
pub fn check(source: &str) -> Result<(), TemplateError> {
    if source.chars().count() > MAX_TEMPLATE_CHARS {
        return Err(TemplateError(format!(
            "must be at most {MAX_TEMPLATE_CHARS} characters"
        )));
    }
    environment()
        .template_from_str(source)
        .map(|_| ())
        .map_err(|e| TemplateError(describe(&e)))
}

/// Renders `source` over `ctx` (a hook's [`Context`], or what a mailbox's
/// template sees).
pub fn render(source: &str, ctx: &impl Serialize) -> Result<String, TemplateError> {
    let env = environment();
    let template = env
        .template_from_str(source)
        .map_err(|e| TemplateError(describe(&e)))?;
    template
        .render(ctx)
        .map_err(|e| TemplateError(describe(&e)))
}

/// The input a Run is started with, rendered from `source` over `ctx`,
/// or why it cannot be one: the template failed, rendered nothing, or
/// rendered more than a Run's input may hold. `whose` names the
/// template's owner in the reason (`hook`, `mailbox`).
pub fn render_input(source: &str, ctx: &impl Serialize, whose: &str) -> Result<String, String> {
    let max = crate::api::MAX_INPUT_CHARS;
    match render(source, ctx) {
        Ok(input) if input.trim().is_empty() => {
            Err(format!("the {whose}'s template rendered nothing"))
        }
        Ok(input) if input.chars().count() > max => {
            Err(format!("the rendered input is over {max} characters"))
        }
        Ok(input) => Ok(input),
        Err(e) => Err(format!("the {whose}'s template failed: {e}")),
    }
}

/// MiniJinja's message with the line it points at (never the source).
fn describe(e: &minijinja::Error) -> String {
    match e.line() {
        Some(line) => format!("{e} (line {line})"),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ctx<'a>(event: &'a str, payload: &'a Value) -> Context<'a> {
        Context {
            event,
            payload,
            hook: HookContext {
                hook_id: "hook_1",
                kind: HookKind::Github,
            },
        }
    }

    #[test]
    fn a_template_renders_the_event_and_payload() {
        let payload = json!({"repository": {"full_name": "octo/hello"}, "ref": "refs/heads/main"});
        let out = render(
            "Review {{ payload.repository.full_name }} at {{ payload.ref }} ({{ event }}, {{ hook.hook_id }})",
            &ctx("push", &payload),
        )
        .unwrap();
        assert_eq!(out, "Review octo/hello at refs/heads/main (push, hook_1)");
    }

    #[test]
    fn an_undefined_name_is_an_error_not_a_blank() {
        let payload = json!({});
        let e = render("{{ payload.repository.full_name }}", &ctx("push", &payload)).unwrap_err();
        assert!(e.0.contains("undefined"), "{e}");
    }

    #[test]
    fn a_template_that_does_not_compile_is_named_with_its_line() {
        let e = check("line one\n{% if %}").unwrap_err();
        assert!(e.0.contains("line 2"), "{e}");
        assert!(check(&"x".repeat(MAX_TEMPLATE_CHARS + 1)).is_err());
        assert_eq!(check("{{ event }}"), Ok(()));
    }

    #[test]
    fn a_runaway_template_runs_out_of_fuel() {
        let payload = json!({});
        let e = render(
            "{% for a in range(10000) %}{% for b in range(10000) %}x{% endfor %}{% endfor %}",
            &ctx("push", &payload),
        )
        .unwrap_err();
        assert!(e.0.contains("fuel"), "{e}");
    }

    #[test]
    fn the_default_templates_render_with_and_without_what_they_name() {
        for kind in HookKind::ALL {
            for payload in [
                json!({}),
                json!({"repository": {"full_name": "octo/hello"}, "status": "firing",
                       "commonLabels": {"alertname": "DiskFull"}, "alerts": [{}]}),
            ] {
                let out = render(default_template(kind), &ctx("push", &payload))
                    .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
                assert!(out.contains("Payload:"), "{out}");
            }
        }
        let payload = json!({"repository": {"full_name": "octo/hello"}});
        let out = render(default_template(HookKind::Github), &ctx("push", &payload)).unwrap();
        assert!(
            out.starts_with("GitHub sent a push event for octo/hello."),
            "{out}"
        );
    }
}

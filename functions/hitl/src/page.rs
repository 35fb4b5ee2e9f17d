//! The review page an approval link opens: plain, accessible HTML that
//! says who wants to do what, with Approve and Reject buttons in a form
//! that works without JavaScript. A GET only shows (mail scanners fetch
//! links); the form's POST decides. A link that is forged, another
//! approval's, used or expired gets a page that says so, with a 4xx.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use utoipa::IntoParams;

use armada_api::server::{Path, Query, RawBody};
use armada_api::ApiError;
use armada_core::clock::rfc3339;
use armada_core::Services;
use armada_domain::approval::{codes, Approval, ApprovalKind, ApprovalState, Decider, Verdict};

use crate::{comment, decide, form, SourceIp, MAX_BODY_BYTES, MAX_COMMENT_BYTES};

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ReviewQuery {
    /// The link's token.
    #[serde(default)]
    token: Option<String>,
}

/// The review page an approval link opens: what is asked, and a form to
/// decide it. Showing it changes nothing.
#[utoipa::path(get, path = "/v1/approvals/{approval_id}/review", tag = "approvals",
    params(("approval_id" = String, Path, description = "The approval's id (`apv_…`)."), ReviewQuery),
    responses(
        (status = 200, description = "The page, with the form.", content_type = "text/html"),
        (status = 403, description = "The link is not valid.", content_type = "text/html"),
        (status = 409, description = "Nothing left to decide.", content_type = "text/html"),
        (status = 503, description = "Briefly unavailable.", content_type = "text/html"),
    ))]
pub(crate) async fn show(
    State(svc): State<Arc<Services>>,
    Path(id): Path<String>,
    Query(q): Query<ReviewQuery>,
) -> Response {
    let token = q.token.unwrap_or_default();
    let a = match svc.approvals.get(&id).await {
        Ok(Some(a)) => a,
        Ok(None) => return invalid_link(),
        Err(e) => return unavailable(e.into()),
    };
    if a.token_recipient(&token).is_none() {
        return invalid_link();
    }
    let now = svc.clock.now_ms();
    if a.state() != ApprovalState::Pending || a.is_overdue(now) {
        return html(409, "Nothing left to decide", &settled(&a, now));
    }
    let (title, question, buttons) = match a.kind {
        ApprovalKind::Gate => ("Approval needed", "", GATE_BUTTONS),
        ApprovalKind::Indeterminate => ("Did it happen?", UNCERTAIN, UNCERTAIN_BUTTONS),
    };
    let body = format!(
        "{question}{details}\n<form method=\"post\" action=\"/v1/approvals/{id}/review\">\n\
         <input type=\"hidden\" name=\"token\" value=\"{token}\">\n\
         <p><label for=\"comment\">Comment (optional)</label><br>\n\
         <textarea id=\"comment\" name=\"comment\" rows=\"3\" cols=\"60\" maxlength=\"{max}\"></textarea></p>\n\
         <p>{buttons}</p>\n</form>",
        details = details(&a),
        id = esc(&a.approval_id),
        token = esc(&token),
        max = MAX_COMMENT_BYTES,
    );
    html(200, title, &body)
}

const GATE_BUTTONS: &str =
    "<button type=\"submit\" name=\"decision\" value=\"approve\" id=\"approve\">Approve</button>\n\
     <button type=\"submit\" name=\"decision\" value=\"reject\" id=\"reject\">Reject</button>";

/// An uncertain call's question, and where the result goes if it happened.
const UNCERTAIN: &str = "<p>The sandbox running this call was lost after the call was sent: \
     whether it took effect is unknown. Check, then say what happened.</p>\n\
     <p><label for=\"result\">What it returned, if it happened (text or JSON)</label><br>\n\
     <textarea id=\"result\" name=\"result\" rows=\"3\" cols=\"60\"></textarea></p>\n";

const UNCERTAIN_BUTTONS: &str = "<button type=\"submit\" name=\"decision\" value=\"happened\" id=\"happened\">It happened</button>\n\
     <button type=\"submit\" name=\"decision\" value=\"retry\" id=\"retry\">Run it again</button>\n\
     <button type=\"submit\" name=\"decision\" value=\"fail\" id=\"fail\">Fail the run</button>";

/// The review page's form: `token`, `decision`, and optionally
/// `comment` and `result`, form-encoded.
#[utoipa::path(post, path = "/v1/approvals/{approval_id}/review", tag = "approvals",
    params(("approval_id" = String, Path, description = "The approval's id (`apv_…`).")),
    request_body(content = String, content_type = "application/x-www-form-urlencoded"),
    responses(
        (status = 200, description = "Decided: what happens now.", content_type = "text/html"),
        (status = 400, description = "The form was not understood.", content_type = "text/html"),
        (status = 403, description = "The link is not valid.", content_type = "text/html"),
        (status = 409, description = "Nothing left to decide.", content_type = "text/html"),
        (status = 413, description = "The form is too large.", content_type = "text/html"),
        (status = 503, description = "Briefly unavailable.", content_type = "text/html"),
    ))]
pub(crate) async fn submit(
    State(svc): State<Arc<Services>>,
    Path(id): Path<String>,
    source: SourceIp,
    raw: Result<RawBody, ApiError>,
) -> Response {
    let raw = match raw {
        Ok(RawBody(raw)) if raw.len() <= MAX_BODY_BYTES => raw,
        _ => return html(413, "Too large", "<p>The form is too large.</p>"),
    };
    let (svc, id) = (svc.as_ref(), id.as_str());
    let text = std::str::from_utf8(&raw).unwrap_or_default();
    let mut f = form(text);
    let token = f.remove("token").unwrap_or_default();
    // A result given for an uncertain call: JSON if it is JSON, else text.
    let result = f
        .get("result")
        .map(|r| r.trim())
        .filter(|r| !r.is_empty())
        .map(|r| serde_json::from_str(r).unwrap_or_else(|_| json!(r)));
    let Some(verdict) = f.get("decision").and_then(|d| Verdict::parse(d, result)) else {
        return html(
            400,
            "Not understood",
            "<p>The form did not say approve or reject.</p>",
        );
    };
    let comment = match comment(f.get("comment").map(String::as_str)) {
        Ok(c) => c,
        Err(e) => {
            return html(
                400,
                "Not understood",
                &format!("<p>{}</p>", esc(&e.message)),
            )
        }
    };
    let by = Decider::Token { token };
    match decide(svc, id, verdict, by, source.0, comment, None).await {
        Ok(a) => {
            let (title, what) = match &a.verdict {
                Some(Verdict::Approve) => {
                    ("Approved", "approved: the run goes on and the action runs")
                }
                Some(Verdict::Happened { .. }) => (
                    "Settled",
                    "said it happened: the run goes on with the result you gave",
                ),
                Some(Verdict::Retry) => ("Settled", "asked to run it again: it is sent again"),
                Some(Verdict::Fail) => ("Settled", "failed the run"),
                _ => (
                    "Rejected",
                    "rejected: the agent is told the action was refused",
                ),
            };
            let body = format!("<p id=\"result\">You {what}.</p>\n{}", details(&a));
            html(200, title, &body)
        }
        Err(e) if e.status == 404 || e.code == codes::TOKEN_INVALID => invalid_link(),
        Err(e) if e.status >= 500 => unavailable(e),
        Err(e) => {
            // Decided before (a double click, the other button elsewhere),
            // expired, cancelled: say what it is now.
            let now = svc.clock.now_ms();
            match svc.approvals.get(id).await {
                Ok(Some(a)) => html(e.status, "Nothing left to decide", &settled(&a, now)),
                _ => html(
                    e.status,
                    "Nothing left to decide",
                    &format!("<p>{}</p>", esc(&e.message)),
                ),
            }
        }
    }
}

/// What the approval asks, as a definition list.
fn details(a: &Approval) -> String {
    let args = serde_json::to_string_pretty(&a.args).unwrap_or_default();
    let row = |k: &str, v: &str| format!("<dt>{k}</dt><dd>{}</dd>\n", esc(v));
    let mut out = String::from("<dl>\n");
    out += &row("Agent", &a.agent);
    out += &row("Run", &a.run_id);
    out += &row("Tool", &a.tool);
    out += &format!("<dt>Arguments</dt><dd><pre>{}</pre></dd>\n", esc(&args));
    out += &row("Risk", &format!("{:?}", a.risk).to_lowercase());
    out += &row("Why it needs approval", &a.reasons.join("; "));
    let by = a.requested_by.as_ref().map(|k| format!("API key {k}"));
    out += &row("Run started by", by.as_deref().unwrap_or("(unknown)"));
    out += &row("Asked at", &rfc3339(a.created_at_ms));
    out += &row("Decide before", &rfc3339(a.expires_at_ms));
    out += "</dl>";
    out
}

/// What became of an approval that can no longer be decided.
fn settled(a: &Approval, now: i64) -> String {
    let what = match a.state() {
        ApprovalState::Pending if a.is_overdue(now) => {
            "It expired before anyone decided; it counts as a rejection.".to_string()
        }
        ApprovalState::Expired => {
            "It expired before anyone decided; it counts as a rejection.".to_string()
        }
        ApprovalState::Cancelled => {
            "The run was cancelled; there is nothing left to decide.".to_string()
        }
        state => {
            let d = a.decision.as_ref();
            format!(
                "It was already decided: {} by {} at {}.",
                state.as_str(),
                d.map(|d| d.by.as_str()).unwrap_or("someone"),
                d.map(|d| rfc3339(d.at_ms)).unwrap_or_default(),
            )
        }
    };
    format!("<p id=\"result\">{}</p>\n{}", esc(&what), details(a))
}

fn invalid_link() -> Response {
    html(
        403,
        "This link is not valid",
        "<p id=\"result\">This link is not valid for any approval: it may have been mistyped, or replaced by a newer one. Nothing was changed.</p>",
    )
}

fn unavailable(e: ApiError) -> Response {
    html(
        e.status,
        "Try again",
        "<p>The service is briefly unavailable. Nothing was changed; try again in a moment.</p>",
    )
}

/// HTML-escapes text for element content and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn html(status: u16, title: &str, body: &str) -> Response {
    let page = format!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{title} - Armada</title>\n\
         <style>body{{font-family:sans-serif;max-width:44rem;margin:2rem auto;padding:0 1rem;line-height:1.5}}\
         dl{{display:grid;grid-template-columns:max-content 1fr;gap:.4rem 1.2rem}}dt{{font-weight:bold}}dd{{margin:0}}\
         pre{{background:#f4f4f4;padding:.5rem;margin:0;overflow-x:auto}}\
         button{{font-size:1.1rem;padding:.4rem 1.2rem;margin-right:1rem}}</style>\n\
         </head>\n<body>\n<main>\n<h1>{title}</h1>\n{body}\n</main>\n</body>\n</html>\n",
        title = esc(title),
    );
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [
            ("content-type", "text/html; charset=utf-8"),
            // The token is in the URL: never cached, never sent on.
            ("cache-control", "no-store"),
            ("referrer-policy", "no-referrer"),
            ("x-frame-options", "DENY"),
            (
                "content-security-policy",
                "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'",
            ),
        ],
        page,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped() {
        assert_eq!(
            esc("<script>\"x\" & 'y'</script>"),
            "&lt;script&gt;&quot;x&quot; &amp; &#39;y&#39;&lt;/script&gt;"
        );
    }
}

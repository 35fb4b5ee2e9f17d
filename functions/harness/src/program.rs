//! A program call as the harness sends it: its files copied where its
//! sandbox can read them, and its environment, each secret
//! opened as the Run's tenant's, the whole sealed for the sandbox
//! generation the call goes to and bound to the call. A secret the tenant
//! does not have refuses the call (it is answered `SECRET_NOT_FOUND`,
//! naming only the name, without running).

use armada_core::error::StoreError;
use armada_core::services::secrets::{open_configured, HeaderError, TenantSecrets};
use armada_domain::agent::AgentDefinition;
use armada_domain::program::{env_binding, seal_env, EnvVar, Refusal};
use armada_domain::sandbox::hand::Invocation;
use armada_domain::sandbox::lifecycle::SandboxRecord;
use armada_domain::sandbox::seal::answer_key;
use armada_domain::skill_files::stored_key;

use crate::Harness;
use crate::StepError;

impl Harness {
    /// `inv` with its program's environment opened and sealed (or its
    /// refusal), for the generation of `rec`.
    pub(crate) async fn with_program_env(
        &self,
        agent: &AgentDefinition,
        mut inv: Invocation,
        skill: &str,
        rec: &SandboxRecord,
    ) -> Result<Invocation, StepError> {
        let Some(call) = inv.program.as_mut() else {
            return Ok(inv);
        };
        if let Some(files) = &call.files {
            // The sandbox reads only its own identity's objects: the
            // version it needs is copied there first.
            let from = stored_key(&call.skill, &files.sha256);
            match self.svc.payloads.copy_absent(&from, &files.key).await {
                Ok(()) => {}
                Err(StoreError::Terminal(why)) => {
                    tracing::warn!(skill = %call.skill, %why, "a skill's files are missing");
                    call.refused = Some(Refusal {
                        code: "SKILL_FILES_MISSING".into(),
                        message: format!("the files of skill '{}' are missing", call.skill),
                    });
                    return Ok(inv);
                }
                Err(e) => return Err(e.into()),
            }
        }
        let env = agent
            .manifest(skill)
            .and_then(|m| m.program)
            .map(|p| p.env)
            .unwrap_or_default();
        if env.is_empty() {
            return Ok(inv);
        }
        let secrets = TenantSecrets {
            svc: &self.svc,
            tenant: &inv.tenant,
        };
        let vars: Vec<EnvVar> = match open_configured(&env, &secrets).await {
            Ok(opened) => opened
                .into_iter()
                .map(|o| EnvVar {
                    name: o.name,
                    value: o.value,
                    secret: o.secret,
                })
                .collect(),
            Err(HeaderError::NotFound { secret, header }) => {
                call.refused = Some(Refusal {
                    code: "SECRET_NOT_FOUND".into(),
                    message: format!("no secret '{secret}' (variable {header})"),
                });
                return Ok(inv);
            }
            Err(e @ HeaderError::Unavailable(_)) => return Err(StepError::Retry(e.to_string())),
        };
        let key = answer_key(
            &self.svc.cfg.callback_signing_secret,
            &inv.tenant,
            &inv.agent,
            rec.generation,
            &rec.salt,
        );
        let binding = env_binding(&inv.run_id, &inv.call_id, inv.attempt);
        call.env = seal_env(&key, &binding, &vars);
        if call.env.is_none() {
            return Err(StepError::Retry(
                "the program's environment could not be sealed".into(),
            ));
        }
        Ok(inv)
    }
}

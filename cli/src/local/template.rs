//! Reads `infra/template.yaml` and resolves what the local stack needs from
//! it: tables, queues and buckets with their physical names, the functions'
//! environment, their HTTP routes and their SQS event source mappings. The
//! template is the one list of resources; nothing here repeats it.

use std::collections::{BTreeMap, HashMap};

use anyhow::{anyhow, bail, Context, Result};
use serde_norway::Value;

/// The pseudo parameter the emulator's account is given under (`Ref:
/// AWS::AccountId`, and the ARN of a role), as CloudFormation knows it.
pub const ACCOUNT_ID: &str = "AWS::AccountId";

#[derive(Debug, Clone)]
pub struct Template {
    resources: BTreeMap<String, Value>,
    parameters: HashMap<String, String>,
    stack: String,
    region: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TableSpec {
    pub logical_id: String,
    pub name: String,
    /// (attribute, type) of every AttributeDefinition.
    pub attributes: Vec<(String, String)>,
    /// (attribute, HASH|RANGE).
    pub key: Vec<(String, String)>,
    pub indexes: Vec<IndexSpec>,
    pub ttl_attribute: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct IndexSpec {
    pub name: String,
    pub key: Vec<(String, String)>,
    pub projection: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct QueueSpec {
    pub logical_id: String,
    pub name: String,
    pub fifo: bool,
    pub content_dedup: bool,
    pub visibility_timeout: Option<u32>,
    pub retention: Option<u32>,
    /// (dead-letter queue logical id, maxReceiveCount)
    pub redrive: Option<(String, u32)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TaskDefSpec {
    pub logical_id: String,
    pub family: String,
    pub cpu: String,
    pub memory: String,
    pub containers: Vec<ContainerSpec>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ContainerSpec {
    pub name: String,
    pub image: String,
    pub memory_mb: i32,
    pub command: Vec<String>,
    pub environment: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub method: String,
    pub path: String,
    pub function: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct EventSourceMapping {
    pub function: String,
    pub queue_logical_id: String,
    pub batch_size: u32,
    pub report_batch_item_failures: bool,
}

fn get<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.as_mapping()?.get(key)
}

fn str_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

impl Template {
    /// Parses the template; `overrides` replace parameter defaults, as
    /// `sam deploy --parameter-overrides` would.
    pub fn parse(
        text: &str,
        stack: &str,
        region: &str,
        overrides: &HashMap<String, String>,
    ) -> Result<Self> {
        let doc: Value = serde_norway::from_str(text).context("infra/template.yaml is not YAML")?;
        let mut parameters = HashMap::new();
        if let Some(Value::Mapping(ps)) = get(&doc, "Parameters") {
            for (k, v) in ps {
                let name = str_of(k).ok_or_else(|| anyhow!("bad parameter name"))?;
                if let Some(d) = get(v, "Default").and_then(str_of) {
                    parameters.insert(name, d);
                }
            }
        }
        for (k, v) in overrides {
            parameters.insert(k.clone(), v.clone());
        }
        let mut resources = BTreeMap::new();
        match get(&doc, "Resources") {
            Some(Value::Mapping(rs)) => {
                for (k, v) in rs {
                    resources.insert(str_of(k).unwrap_or_default(), v.clone());
                }
            }
            _ => bail!("the template has no Resources"),
        }
        // Globals.Function is merged into every function, as SAM does.
        if let Some(globals) = get(&doc, "Globals")
            .and_then(|g| get(g, "Function"))
            .cloned()
        {
            for r in resources.values_mut() {
                if get(r, "Type").and_then(Value::as_str) == Some("AWS::Serverless::Function") {
                    if let Some(Value::Mapping(props)) =
                        r.as_mapping_mut().and_then(|m| m.get_mut("Properties"))
                    {
                        for (gk, gv) in globals.as_mapping().into_iter().flatten() {
                            if !props.contains_key(gk) {
                                props.insert(gk.clone(), gv.clone());
                            }
                        }
                    }
                }
            }
        }
        Ok(Template {
            resources,
            parameters,
            stack: stack.to_string(),
            region: region.to_string(),
        })
    }

    fn of_type(&self, ty: &str) -> impl Iterator<Item = (&String, &Value)> {
        let ty = ty.to_string();
        self.resources
            .iter()
            .filter(move |(_, r)| get(r, "Type").and_then(Value::as_str) == Some(ty.as_str()))
    }

    fn props<'a>(&self, r: &'a Value) -> Option<&'a Value> {
        get(r, "Properties")
    }

    /// The physical name of a resource: its explicit name property, or a
    /// name derived from the stack and logical id (as CloudFormation would
    /// generate one).
    pub fn physical_name(&self, logical_id: &str) -> Result<String> {
        let r = self
            .resources
            .get(logical_id)
            .ok_or_else(|| anyhow!("unknown resource {logical_id}"))?;
        let ty = get(r, "Type").and_then(Value::as_str).unwrap_or_default();
        let prop = match ty {
            "AWS::DynamoDB::Table" => "TableName",
            "AWS::SQS::Queue" => "QueueName",
            "AWS::S3::Bucket" => "BucketName",
            "AWS::ECS::Cluster" => "ClusterName",
            "AWS::ECS::TaskDefinition" => "Family",
            "AWS::Logs::LogGroup" => "LogGroupName",
            "AWS::IAM::Role" => "RoleName",
            "AWS::SNS::Topic" => "TopicName",
            _ => "Name",
        };
        match self.props(r).and_then(|p| get(p, prop)) {
            Some(v) => self.resolve_str(v),
            None => Ok(format!(
                "{}-{}",
                self.stack,
                logical_id.to_ascii_lowercase()
            )),
        }
    }

    /// Resolves a scalar or intrinsic to a string. `Ref` of a queue resolves
    /// to its name here; callers that need a URL or ARN look it up.
    pub fn resolve_str(&self, v: &Value) -> Result<String> {
        if let Some(s) = str_of(v) {
            return Ok(s);
        }
        if let Some(r) = get(v, "Ref").and_then(Value::as_str) {
            if let Some(p) = self.parameters.get(r) {
                return Ok(p.clone());
            }
            return match r {
                "AWS::StackName" => Ok(self.stack.clone()),
                "AWS::Region" => Ok(self.region.clone()),
                // A topic's Ref is its ARN, in the emulator's account.
                other if self.type_of(other) == Some("AWS::SNS::Topic") => Ok(format!(
                    "arn:aws:sns:{}:{}:{}",
                    self.region,
                    self.parameters
                        .get(ACCOUNT_ID)
                        .ok_or_else(|| anyhow!("the topic {other} needs the stack's account"))?,
                    self.physical_name(other)?
                )),
                other if self.resources.contains_key(other) => self.physical_name(other),
                other => bail!("Ref to unknown {other}"),
            };
        }
        if let Some(Value::Sequence(ga)) = get(v, "Fn::GetAtt") {
            let res = ga.first().and_then(Value::as_str).unwrap_or_default();
            let attr = ga.get(1).and_then(Value::as_str).unwrap_or_default();
            let ty = self
                .resources
                .get(res)
                .and_then(|r| get(r, "Type"))
                .and_then(Value::as_str);
            return match attr {
                // A role is assumed by its ARN, in the emulator's account.
                "Arn" if ty == Some("AWS::IAM::Role") => Ok(format!(
                    "arn:aws:iam::{}:role/{}",
                    self.parameters
                        .get(ACCOUNT_ID)
                        .ok_or_else(|| anyhow!("the role {res} needs the stack's account"))?,
                    self.physical_name(res)?
                )),
                // A queue's ARN, as the emulator makes it: SNS delivers to it
                // and EventBridge Scheduler's targets name it.
                "Arn" if ty == Some("AWS::SQS::Queue") => Ok(format!(
                    "arn:aws:sqs:{}:{}:{}",
                    self.region,
                    self.parameters
                        .get(ACCOUNT_ID)
                        .ok_or_else(|| anyhow!("the queue {res} needs the stack's account"))?,
                    self.physical_name(res)?
                )),
                // The local stack seals secrets under the key derived from
                // the deployment secret: it names no KMS key.
                "Arn" if ty == Some("AWS::KMS::Key") => Ok(String::new()),
                "QueueName" | "Arn" => self.physical_name(res),
                other => bail!("GetAtt {res}.{other} is not supported locally"),
            };
        }
        // Locally a list parameter is its comma-separated text already.
        if let Some(Value::Sequence(j)) = get(v, "Fn::Join") {
            let sep = j.first().and_then(Value::as_str).unwrap_or_default();
            let parts: Vec<String> = match j.get(1) {
                Some(Value::Sequence(items)) => items
                    .iter()
                    .map(|i| self.resolve_str(i))
                    .collect::<Result<_>>()?,
                Some(other) => vec![self.resolve_str(other)?],
                None => vec![],
            };
            return Ok(parts.join(sep));
        }
        if let Some(Value::String(s)) = get(v, "Fn::Sub") {
            let mut out = String::new();
            let mut rest = s.as_str();
            while let Some(start) = rest.find("${") {
                out.push_str(&rest[..start]);
                let end = rest[start..]
                    .find('}')
                    .ok_or_else(|| anyhow!("unterminated ${{ in {s}"))?;
                let name = &rest[start + 2..start + end];
                let mut m = serde_norway::Mapping::new();
                m.insert(Value::String("Ref".into()), Value::String(name.into()));
                out.push_str(&self.resolve_str(&Value::Mapping(m))?);
                rest = &rest[start + end + 1..];
            }
            out.push_str(rest);
            return Ok(out);
        }
        bail!("cannot resolve {v:?} locally")
    }

    /// The logical id a `Fn::GetAtt [X, Arn]` or `Ref: X` names.
    fn referenced(&self, v: &Value) -> Option<String> {
        if let Some(Value::Sequence(ga)) = get(v, "Fn::GetAtt") {
            return ga.first().and_then(Value::as_str).map(str::to_string);
        }
        get(v, "Ref").and_then(Value::as_str).map(str::to_string)
    }

    pub fn tables(&self) -> Result<Vec<TableSpec>> {
        let pairs = |v: Option<&Value>, a: &str, b: &str| -> Vec<(String, String)> {
            v.and_then(Value::as_sequence)
                .into_iter()
                .flatten()
                .filter_map(|e| Some((get(e, a).and_then(str_of)?, get(e, b).and_then(str_of)?)))
                .collect()
        };
        self.of_type("AWS::DynamoDB::Table")
            .map(|(id, r)| {
                let p = self
                    .props(r)
                    .ok_or_else(|| anyhow!("{id} has no Properties"))?;
                let indexes = get(p, "GlobalSecondaryIndexes")
                    .and_then(Value::as_sequence)
                    .into_iter()
                    .flatten()
                    .map(|g| IndexSpec {
                        name: get(g, "IndexName").and_then(str_of).unwrap_or_default(),
                        key: pairs(get(g, "KeySchema"), "AttributeName", "KeyType"),
                        projection: get(g, "Projection")
                            .and_then(|pr| get(pr, "ProjectionType"))
                            .and_then(str_of)
                            .unwrap_or_else(|| "ALL".into()),
                    })
                    .collect();
                let ttl = get(p, "TimeToLiveSpecification")
                    .filter(|t| get(t, "Enabled").and_then(Value::as_bool) == Some(true))
                    .and_then(|t| get(t, "AttributeName"))
                    .and_then(str_of);
                Ok(TableSpec {
                    logical_id: id.clone(),
                    name: self.physical_name(id)?,
                    attributes: pairs(
                        get(p, "AttributeDefinitions"),
                        "AttributeName",
                        "AttributeType",
                    ),
                    key: pairs(get(p, "KeySchema"), "AttributeName", "KeyType"),
                    indexes,
                    ttl_attribute: ttl,
                })
            })
            .collect()
    }

    pub fn queues(&self) -> Result<Vec<QueueSpec>> {
        self.of_type("AWS::SQS::Queue")
            .map(|(id, r)| {
                let p = self.props(r);
                let num = |k: &str| -> Result<Option<u32>> {
                    match p.and_then(|p| get(p, k)) {
                        None => Ok(None),
                        Some(v) => Ok(Some(self.resolve_str(v)?.parse()?)),
                    }
                };
                let flag = |k: &str| {
                    p.and_then(|p| get(p, k))
                        .and_then(Value::as_bool)
                        .unwrap_or(false)
                };
                let redrive = match p.and_then(|p| get(p, "RedrivePolicy")) {
                    None => None,
                    Some(rp) => {
                        let dlq = get(rp, "deadLetterTargetArn")
                            .and_then(|v| self.referenced(v))
                            .ok_or_else(|| {
                                anyhow!("{id}: deadLetterTargetArn must reference a queue")
                            })?;
                        let max = self
                            .resolve_str(
                                get(rp, "maxReceiveCount")
                                    .ok_or_else(|| anyhow!("{id}: no maxReceiveCount"))?,
                            )?
                            .parse()?;
                        Some((dlq, max))
                    }
                };
                Ok(QueueSpec {
                    logical_id: id.clone(),
                    name: self.physical_name(id)?,
                    fifo: flag("FifoQueue"),
                    content_dedup: flag("ContentBasedDeduplication"),
                    visibility_timeout: num("VisibilityTimeout")?,
                    retention: num("MessageRetentionPeriod")?,
                    redrive,
                })
            })
            .collect()
    }

    /// The ECS clusters' names.
    pub fn clusters(&self) -> Result<Vec<String>> {
        self.of_type("AWS::ECS::Cluster")
            .map(|(id, _)| self.physical_name(id))
            .collect()
    }

    /// The ECS task definitions, as the local stack registers them.
    pub fn task_definitions(&self) -> Result<Vec<TaskDefSpec>> {
        self.of_type("AWS::ECS::TaskDefinition")
            .map(|(id, r)| {
                let p = self
                    .props(r)
                    .ok_or_else(|| anyhow!("{id} has no Properties"))?;
                let s = |k: &str| -> Result<String> {
                    self.resolve_str(get(p, k).ok_or_else(|| anyhow!("{id} has no {k}"))?)
                };
                let containers = get(p, "ContainerDefinitions")
                    .and_then(Value::as_sequence)
                    .into_iter()
                    .flatten()
                    .map(|c| {
                        let cs = |k: &str| -> Result<String> {
                            self.resolve_str(
                                get(c, k).ok_or_else(|| anyhow!("{id}: a container has no {k}"))?,
                            )
                        };
                        let environment = get(c, "Environment")
                            .and_then(Value::as_sequence)
                            .into_iter()
                            .flatten()
                            .map(|kv| {
                                Ok((
                                    get(kv, "Name").and_then(str_of).unwrap_or_default(),
                                    self.resolve_str(get(kv, "Value").unwrap_or(&Value::Null))?,
                                ))
                            })
                            .collect::<Result<Vec<_>>>()?;
                        Ok(ContainerSpec {
                            name: cs("Name")?,
                            image: cs("Image")?,
                            memory_mb: cs("Memory")?.parse()?,
                            command: get(c, "Command")
                                .and_then(Value::as_sequence)
                                .into_iter()
                                .flatten()
                                .filter_map(str_of)
                                .collect(),
                            environment,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(TaskDefSpec {
                    logical_id: id.clone(),
                    family: self.physical_name(id)?,
                    cpu: s("Cpu")?,
                    memory: s("Memory")?,
                    containers,
                })
            })
            .collect()
    }

    /// EventBridge Scheduler's groups (schedules' timers live in them).
    pub fn schedule_groups(&self) -> Result<Vec<String>> {
        self.of_type("AWS::Scheduler::ScheduleGroup")
            .map(|(id, _)| self.physical_name(id))
            .collect()
    }

    fn type_of(&self, logical_id: &str) -> Option<&str> {
        self.resources
            .get(logical_id)
            .and_then(|r| get(r, "Type"))
            .and_then(Value::as_str)
    }

    /// SNS topics, by name.
    pub fn topics(&self) -> Result<Vec<String>> {
        self.of_type("AWS::SNS::Topic")
            .map(|(id, _)| self.physical_name(id))
            .collect()
    }

    /// SNS subscriptions of queues: (topic ARN, queue ARN, raw delivery).
    pub fn queue_subscriptions(&self) -> Result<Vec<(String, String, bool)>> {
        self.of_type("AWS::SNS::Subscription")
            .filter_map(|(_, r)| self.props(r))
            .filter(|p| get(p, "Protocol").and_then(str_of).as_deref() == Some("sqs"))
            .map(|p| {
                let field = |k: &str| {
                    get(p, k)
                        .ok_or_else(|| anyhow!("a subscription without {k}"))
                        .and_then(|v| self.resolve_str(v))
                };
                let raw = get(p, "RawMessageDelivery").and_then(str_of).as_deref() == Some("true");
                Ok((field("TopicArn")?, field("Endpoint")?, raw))
            })
            .collect()
    }

    pub fn buckets(&self) -> Result<Vec<String>> {
        self.of_type("AWS::S3::Bucket")
            .map(|(id, _)| self.physical_name(id))
            .collect()
    }

    /// The binary a function's logical id builds (`Metadata.BuildProperties.Binary`).
    fn binary(&self, r: &Value) -> Option<String> {
        get(r, "Metadata")
            .and_then(|m| get(m, "BuildProperties"))
            .and_then(|b| get(b, "Binary"))
            .and_then(str_of)
    }

    fn functions(&self) -> impl Iterator<Item = (String, &Value)> {
        self.of_type("AWS::Serverless::Function")
            .filter_map(|(_, r)| Some((self.binary(r)?, r)))
    }

    /// A function's environment variables, resolved to physical names.
    pub fn environment(&self, binary: &str) -> Result<HashMap<String, String>> {
        let (_, r) = self
            .functions()
            .find(|(b, _)| b == binary)
            .ok_or_else(|| anyhow!("no function builds binary {binary}"))?;
        let vars = self
            .props(r)
            .and_then(|p| get(p, "Environment"))
            .and_then(|e| get(e, "Variables"))
            .and_then(Value::as_mapping);
        let mut env = HashMap::new();
        for (k, v) in vars.into_iter().flatten() {
            env.insert(str_of(k).unwrap_or_default(), self.resolve_str(v)?);
        }
        Ok(env)
    }

    pub fn routes(&self) -> Vec<Route> {
        self.events("HttpApi")
            .filter_map(|(f, p)| {
                Some(Route {
                    method: get(p, "Method").and_then(str_of)?.to_ascii_uppercase(),
                    path: get(p, "Path").and_then(str_of)?,
                    function: f,
                })
            })
            .collect()
    }

    pub fn event_source_mappings(&self) -> Vec<EventSourceMapping> {
        self.events("SQS")
            .filter_map(|(f, p)| {
                Some(EventSourceMapping {
                    function: f,
                    queue_logical_id: self.referenced(get(p, "Queue")?)?,
                    batch_size: get(p, "BatchSize")
                        .and_then(|v| str_of(v)?.parse().ok())
                        .unwrap_or(10),
                    report_batch_item_failures: get(p, "FunctionResponseTypes")
                        .and_then(Value::as_sequence)
                        .is_some_and(|s| {
                            s.iter()
                                .any(|t| t.as_str() == Some("ReportBatchItemFailures"))
                        }),
                })
            })
            .collect()
    }

    fn events(&self, ty: &'static str) -> impl Iterator<Item = (String, &Value)> {
        self.functions().flat_map(move |(bin, r)| {
            get(r, "Properties")
                .and_then(|p| get(p, "Events"))
                .and_then(Value::as_mapping)
                .into_iter()
                .flatten()
                .filter(move |(_, e)| get(e, "Type").and_then(Value::as_str) == Some(ty))
                .filter_map(|(_, e)| get(e, "Properties"))
                .map(move |p| (bin.clone(), p))
        })
    }

    pub fn stack(&self) -> &str {
        &self.stack
    }

    /// The function timeout in seconds, for visibility-timeout checks.
    pub fn function_timeout(&self, binary: &str) -> Result<u32> {
        let (_, r) = self
            .functions()
            .find(|(b, _)| b == binary)
            .ok_or_else(|| anyhow!("no function builds binary {binary}"))?;
        let t = self
            .props(r)
            .and_then(|p| get(p, "Timeout"))
            .ok_or_else(|| anyhow!("{binary} has no Timeout"))?;
        Ok(self.resolve_str(t)?.parse()?)
    }
}

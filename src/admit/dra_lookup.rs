//! The server's side of DRA: what a Pod's claims give, looked up through the API (the admission
//! request carries only the Pod): its ResourceClaimTemplates or ResourceClaims in the Pod's
//! namespace, and their DeviceClasses, at the newest `resource.k8s.io` version served. Answers
//! are cached for a minute (bounded), so a Deployment's replicas cost one lookup; the whole
//! lookup is bounded by a deadline well inside the API server's webhook timeout, and a refusal
//! or a timeout makes the claim unknown (said to the user), never a GPU-less verdict.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::Value;

use super::dra::{self, ClaimSource, DraView};

/// The lookups of one admission at most (the webhook's timeout is 3 s).
const DEADLINE: Duration = Duration::from_millis(1500);
/// How long an answer is kept.
const TTL: Duration = Duration::from_secs(60);
/// Objects kept at most.
const CACHE_MAX: usize = 4096;
const VERSIONS: [&str; 3] = ["v1", "v1beta2", "v1beta1"];

/// A cached answer: the object's JSON, or why it could not be read.
type Cached = (Instant, Result<Value, String>);

impl std::fmt::Debug for DraResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraResolver")
            .field("drivers", &self.drivers)
            .finish_non_exhaustive()
    }
}

pub struct DraResolver {
    client: Client,
    drivers: Vec<String>,
    cache: Mutex<HashMap<(String, String, String), Cached>>,
    /// The version that answered last (tried first).
    version: Mutex<&'static str>,
}

impl DraResolver {
    pub fn new(client: Client, drivers: Vec<String>) -> DraResolver {
        DraResolver {
            client,
            drivers,
            cache: Mutex::new(HashMap::new()),
            version: Mutex::new(VERSIONS[0]),
        }
    }

    /// What the Pod's claims give; an empty view for a body without claims (not read further).
    pub async fn resolve(&self, body: &[u8]) -> DraView {
        if !body.windows(14).any(|w| w == b"resourceClaims") {
            return DraView::default();
        }
        // Read as the decision reads it, in bounded memory (`parse`): a body too large to judge
        // is admitted unjudged, its claims not looked up.
        let Ok(review) = super::parse::review(body) else {
            return DraView::default();
        };
        let pod = review.pointer("/request/object").unwrap_or(&Value::Null);
        let claims = dra::claims(pod);
        if claims.is_empty() {
            return DraView::default();
        }
        let namespace = review
            .pointer("/request/namespace")
            .and_then(Value::as_str)
            .or_else(|| pod.pointer("/metadata/namespace").and_then(Value::as_str))
            .unwrap_or("default")
            .to_string();
        let mut view = DraView::default();
        let work = async {
            for c in &claims {
                match self.claim_gpus(&namespace, &c.source).await {
                    Ok(0) => {}
                    Ok(n) => {
                        view.gpus.insert(c.name.clone(), n);
                    }
                    Err(why) => view.unknown.push((c.name.clone(), why)),
                }
            }
        };
        if tokio::time::timeout(DEADLINE, work).await.is_err() {
            let answered: Vec<String> = view.gpus.keys().cloned().collect();
            for c in &claims {
                let known =
                    answered.contains(&c.name) || view.unknown.iter().any(|(n, _)| n == &c.name);
                if !known {
                    view.unknown
                        .push((c.name.clone(), "the lookup took too long".into()));
                }
            }
        }
        if !view.unknown.is_empty() {
            tracing::warn!(namespace = %namespace, unknown = ?view.unknown, "DRA claims not told");
        }
        view
    }

    async fn claim_gpus(&self, namespace: &str, source: &ClaimSource) -> Result<u64, String> {
        let (kind, plural, name) = match source {
            ClaimSource::Claim(n) => ("ResourceClaim", "resourceclaims", n),
            ClaimSource::Template(n) => ("ResourceClaimTemplate", "resourceclaimtemplates", n),
        };
        let object = self.get(kind, plural, Some(namespace), name).await?;
        let requests = dra::requests(&object);
        let mut gpu_classes = HashMap::new();
        for r in &requests {
            if !gpu_classes.contains_key(&r.class) {
                let class = self
                    .get("DeviceClass", "deviceclasses", None, &r.class)
                    .await?;
                gpu_classes.insert(r.class.clone(), dra::class_is_gpu(&class, &self.drivers));
            }
        }
        Ok(DraView::count(&requests, |c| {
            gpu_classes.get(c) == Some(&true)
        }))
    }

    /// One object, from the cache or the API (the newest version that serves the kind).
    async fn get(
        &self,
        kind: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, String> {
        let key = (
            kind.to_string(),
            namespace.unwrap_or("").to_string(),
            name.to_string(),
        );
        if let Some((at, answer)) = self.lock_cache().get(&key) {
            if at.elapsed() < TTL {
                return answer.clone();
            }
        }
        let answer = self.fetch(kind, plural, namespace, name).await;
        let mut cache = self.lock_cache();
        if cache.len() >= CACHE_MAX {
            cache.retain(|_, (at, _)| at.elapsed() < TTL);
            if cache.len() >= CACHE_MAX {
                cache.clear();
            }
        }
        cache.insert(key, (Instant::now(), answer.clone()));
        answer
    }

    async fn fetch(
        &self,
        kind: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, String> {
        let first = *self.version.lock().unwrap_or_else(|e| e.into_inner());
        let order = std::iter::once(first).chain(VERSIONS.into_iter().filter(|v| *v != first));
        let what = match namespace {
            Some(ns) => format!("{kind} {ns}/{name}"),
            None => format!("{kind} {name}"),
        };
        for version in order {
            let gvk = GroupVersionKind::gvk("resource.k8s.io", version, kind);
            let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
            let api: Api<DynamicObject> = match namespace {
                Some(ns) => Api::namespaced_with(self.client.clone(), ns, &ar),
                None => Api::all_with(self.client.clone(), &ar),
            };
            match api.get(name).await {
                Ok(o) => {
                    *self.version.lock().unwrap_or_else(|e| e.into_inner()) = version;
                    return serde_json::to_value(o).map_err(|e| format!("{what}: {e}"));
                }
                // The object's own 404 names it; a version not served is a bare 404: the next.
                Err(kube::Error::Api(s))
                    if s.code == 404 && s.message.contains(&format!("\"{name}\"")) =>
                {
                    return Err(format!("{what} not found"))
                }
                Err(kube::Error::Api(s)) if s.code == 404 => continue,
                Err(kube::Error::Api(s)) if s.code == 403 => {
                    return Err(format!(
                        "{what}: forbidden (RBAC: get {plural}.resource.k8s.io)"
                    ))
                }
                Err(e) => return Err(format!("{what}: {e}")),
            }
        }
        Err(format!("{what}: resource.k8s.io is not served"))
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String, String), Cached>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

//! The REST surface: discovery, and get/list/watch/create/update/patch/
//! delete on every served kind, with the status subresource, as kube-rs and
//! kubectl speak it.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Frame, Incoming};
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::auth::User;
use crate::kinds::Kind;
use crate::select::{FieldSelector, LabelSelector};
use crate::server::Server;
use crate::status::ApiError;
use crate::store::{Event, EventType, Part};

pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Request bodies over this are refused (the real server's limit is 3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;
/// How often a watch that asked for bookmarks gets one.
const BOOKMARK_EVERY: Duration = Duration::from_secs(10);

/// What a resource URL names.
struct Target {
    kind: Kind,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
    /// Reads answered as a Table, and what its rows carry.
    table: Option<crate::table::Include>,
}

pub async fn handle(
    server: Arc<Server>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let verb = req.method().to_string();
    let response = match route(&server, req).await {
        Ok(r) => r,
        Err(e) => json_response(
            StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            &e.status(),
        ),
    };
    let labels = crate::metrics::RequestLabels {
        verb,
        code: response.status().as_u16().to_string(),
    };
    server.metrics.requests.get_or_create(&labels).inc();
    Ok(response)
}

async fn route(server: &Arc<Server>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let path = req.uri().path().trim_end_matches('/').to_owned();
    // Public, as `system:public-info-viewer` makes them on a real server.
    match path.as_str() {
        "/healthz" | "/readyz" | "/livez" => return Ok(text(StatusCode::OK, "ok")),
        "/version" => return Ok(json_ok(&server.version())),
        "/metrics" => {
            let body = Full::new(Bytes::from(server.metrics.text()));
            let mut r = Response::new(BodyExt::boxed_unsync(body));
            r.headers_mut().insert(
                "content-type",
                HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            return Ok(r);
        }
        _ => {}
    }
    let user = server.authenticate(req.headers())?;
    let query = query(req.uri().query());
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segments.as_slice() {
        ["api"] => return Ok(json_ok(&server.core_versions())),
        ["apis"] => return Ok(json_ok(&server.groups())),
        ["api", "v1"] => return Ok(json_ok(&server.resources("", "v1")?)),
        ["apis", group] => return Ok(json_ok(&server.group(group)?)),
        ["apis", group, version] => return Ok(json_ok(&server.resources(group, version)?)),
        ["openapi", "v3"] => return Ok(json_ok(&crate::openapi::root(&server.kinds()))),
        ["openapi", "v3", rest @ ..] => {
            let prefix = format!("/{}", rest.join("/"));
            return crate::openapi::for_prefix(&server.kinds(), &prefix)
                .map(|d| json_ok(&d))
                .ok_or_else(|| ApiError::not_found("", "openapi", &prefix));
        }
        _ => {}
    }
    let mut target = target(server, &segments)?;
    let accept = req.headers().get("accept").and_then(|v| v.to_str().ok());
    target.table = crate::table::wanted(accept)
        .then(|| crate::table::Include::parse(query.get("includeObject").map(String::as_str)));
    let method = req.method().clone();
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_owned();
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Err(ApiError::bad_request(format!(
                "the request body is larger than {MAX_BODY} bytes"
            )));
        }
    };
    serve(server, &user, &target, method, &query, &content_type, &body).await
}

async fn serve(
    server: &Arc<Server>,
    user: &User,
    t: &Target,
    method: Method,
    query: &BTreeMap<String, String>,
    content_type: &str,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let store = &server.store;
    let kind = &t.kind;
    let ns = t.namespace.as_deref().unwrap_or("");
    if kind.namespaced && t.name.is_some() && t.namespace.is_none() {
        return Err(ApiError::not_found(
            &kind.group,
            &kind.plural,
            t.name.as_deref().unwrap_or(""),
        ));
    }
    if let Some(answer) = reviews(server, user, t, &method, content_type, body)? {
        return Ok(answer);
    }
    let part = match (t.subresource.as_deref(), kind.status) {
        (None, true) => Part::Main,
        (None, false) => Part::Whole,
        (Some("status"), true) => Part::Status,
        (Some(other), _) => {
            return Err(ApiError::not_found(
                &kind.group,
                &format!("{}/{other}", kind.plural),
                t.name.as_deref().unwrap_or(""),
            ));
        }
    };
    let verb = match (&method, t.name.is_some()) {
        (&Method::GET, false) if flag(query, "watch") => "watch",
        (&Method::GET, false) => "list",
        (&Method::GET, true) => "get",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        _ => "unknown",
    };
    // A list or watch of one object by name is authorized as that name, so
    // a Role with resourceNames may watch exactly the objects it names.
    let selected = match verb {
        "list" | "watch" => {
            FieldSelector::parse(query.get("fieldSelector").map_or("", String::as_str))?
        }
        _ => FieldSelector::default(),
    };
    let attributes = crate::rbac::Attributes {
        verb,
        group: &kind.group,
        resource: &kind.plural,
        subresource: t.subresource.as_deref(),
        namespace: t.namespace.as_deref().filter(|_| kind.namespaced),
        name: t.name.as_deref().or(selected.required_name()),
    };
    crate::rbac::authorize(store, user, &attributes)?;
    match (&method, t.name.as_deref()) {
        (&Method::GET, None) if flag(query, "watch") => watch(server, t, query),
        (&Method::GET, None) => list(server, t, query),
        (&Method::GET, Some(name)) => {
            let object = store
                .get(&kind.resource(), ns, name)
                .ok_or_else(|| ApiError::not_found(&kind.group, &kind.plural, name))?;
            Ok(json_ok(&render(object, kind, t.table)))
        }
        (&Method::POST, None) => {
            let object = parse_object(body, content_type)?;
            check_identity(&object, kind)?;
            if kind.namespaced {
                require_namespace(server, ns)?;
            }
            let name = object
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let object = crate::admission::admit(
                store,
                &review(t, user, "CREATE", &name, Some(&object), None),
            )
            .await?
            .unwrap_or(object);
            let mut object = conform(kind, object, query)?;
            crate::ssa::record_update(None, &mut object, manager(query), None, &kind.api_version());
            let created = store.create(kind, ns, object)?;
            server.after_write(kind, &created);
            Ok(json_response(StatusCode::CREATED, &created))
        }
        (&Method::PUT, Some(name)) => {
            let object = parse_object(body, content_type)?;
            check_identity(&object, kind)?;
            let old = store.get(&kind.resource(), ns, name);
            let object = crate::admission::admit(
                store,
                &review(t, user, "UPDATE", name, Some(&object), old.as_ref()),
            )
            .await?
            .unwrap_or(object);
            let mut object = conform(kind, object, query)?;
            let version = kind.api_version();
            let sub = t.subresource.as_deref();
            crate::ssa::record_update(old.as_ref(), &mut object, manager(query), sub, &version);
            let updated = store.update(kind, ns, name, object, part)?;
            server.after_write(kind, &updated);
            Ok(json_ok(&updated))
        }
        (&Method::PATCH, Some(name)) => {
            // Applied to the latest object and retried when another write
            // got in between, as the real server does — unless the patch
            // may name a resourceVersion (then a conflict is the answer; the
            // test is textual, so a patch that merely mentions the word is
            // treated as pinned, which only costs it the retry).
            let pinned = String::from_utf8_lossy(body).contains("resourceVersion");
            let mut attempts = 0;
            loop {
                attempts += 1;
                let attempt = async {
                    let stored = store.get(&kind.resource(), ns, name);
                    let is_apply = content_type.starts_with("application/apply-patch");
                    let stored = match (stored, is_apply) {
                        (Some(s), _) => s,
                        (None, true) => {
                            // Server-side apply creates what does not exist.
                            let applied = parse_object(body, content_type)?;
                            check_identity(&applied, kind)?;
                            let object =
                                crate::ssa::apply(None, &applied, &applying(kind, t, query))?;
                            if kind.namespaced {
                                require_namespace(server, ns)?;
                            }
                            let object = crate::admission::admit(
                                store,
                                &review(t, user, "CREATE", name, Some(&object), None),
                            )
                            .await?
                            .unwrap_or(object);
                            let object = conform(kind, object, query)?;
                            let created = store.create(kind, ns, object)?;
                            server.after_write(kind, &created);
                            return Ok(json_response(StatusCode::CREATED, &created));
                        }
                        (None, false) => {
                            return Err(ApiError::not_found(&kind.group, &kind.plural, name));
                        }
                    };
                    let mut patched = if is_apply {
                        let applied = parse_object(body, content_type)?;
                        crate::ssa::apply(Some(&stored), &applied, &applying(kind, t, query))?
                    } else {
                        let mut patched = crate::patch::apply(&stored, body, content_type)?;
                        let version = kind.api_version();
                        let sub = t.subresource.as_deref();
                        crate::ssa::record_update(
                            Some(&stored),
                            &mut patched,
                            manager(query),
                            sub,
                            &version,
                        );
                        patched
                    };
                    // A patch that removed resourceVersion is unconditional: it
                    // applies to the object just read.
                    if patched.pointer("/metadata/resourceVersion").is_none() {
                        patched["metadata"]["resourceVersion"] =
                            stored["metadata"]["resourceVersion"].clone();
                    }
                    let patched = crate::admission::admit(
                        store,
                        &review(t, user, "UPDATE", name, Some(&patched), Some(&stored)),
                    )
                    .await?
                    .unwrap_or(patched);
                    let patched = conform(kind, patched, query)?;
                    let updated = store.update(kind, ns, name, patched, part)?;
                    server.after_write(kind, &updated);
                    Ok(json_ok(&updated))
                };
                match attempt.await {
                    Err(e) if e.reason == "Conflict" && !pinned && attempts < 5 => continue,
                    outcome => return outcome,
                }
            }
        }
        (&Method::DELETE, Some(name)) => {
            let old = store.get(&kind.resource(), ns, name);
            crate::admission::admit(store, &review(t, user, "DELETE", name, None, old.as_ref()))
                .await?;
            let deleted = store.delete(kind, ns, name)?;
            server.after_delete(kind, &deleted);
            Ok(json_ok(&deleted))
        }
        (&Method::DELETE, None) => {
            let (items, _) = store.list(&kind.resource(), t.namespace.as_deref());
            let selector =
                LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))?;
            for item in items.iter().filter(|o| selector.matches(o)) {
                let name = item
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let namespace = item
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if let Ok(deleted) = store.delete(kind, namespace, name) {
                    server.after_delete(kind, &deleted);
                }
            }
            Ok(json_ok(
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}),
            ))
        }
        _ => Err(ApiError::method_not_allowed(format!(
            "{method} is not supported here"
        ))),
    }
}

/// Requests answered at once rather than stored: TokenRequests,
/// TokenReviews and SubjectAccessReviews (each authorized like any create).
fn reviews(
    server: &Server,
    user: &User,
    t: &Target,
    method: &Method,
    content_type: &str,
    body: &[u8],
) -> Result<Option<Response<Body>>, ApiError> {
    let kind = &t.kind;
    let token_request =
        kind.plural == "serviceaccounts" && t.subresource.as_deref() == Some("token");
    if *method != Method::POST || !(kind.review || token_request) {
        return Ok(None);
    }
    let attributes = crate::rbac::Attributes {
        verb: "create",
        group: &kind.group,
        resource: &kind.plural,
        subresource: t.subresource.as_deref(),
        namespace: t.namespace.as_deref().filter(|_| kind.namespaced),
        name: t.name.as_deref(),
    };
    crate::rbac::authorize(&server.store, user, &attributes)?;
    let request = parse_object(body, content_type)?;
    let answer = match kind.plural.as_str() {
        "serviceaccounts" => {
            let ns = t.namespace.as_deref().unwrap_or_default();
            let name = t.name.as_deref().unwrap_or_default();
            server.signer.request(&server.store, ns, name, &request)?
        }
        "tokenreviews" => server.signer.review(&server.store, &request),
        _ => subject_access_review(server, &request),
    };
    Ok(Some(json_response(StatusCode::CREATED, &answer)))
}

/// Whether the user a SubjectAccessReview names may do what it asks.
fn subject_access_review(server: &Server, review: &Value) -> Value {
    let spec = review.get("spec").cloned().unwrap_or(json!({}));
    let text = |v: &Value, f: &str| {
        v.get(f)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let user = User {
        name: text(&spec, "user"),
        uid: text(&spec, "uid"),
        groups: crate::values::strings(spec.get("groups")),
        ..User::default()
    };
    let r = spec.get("resourceAttributes").cloned().unwrap_or(json!({}));
    let (namespace, name, subresource) = (
        text(&r, "namespace"),
        text(&r, "name"),
        text(&r, "subresource"),
    );
    let (verb, group, resource) = (text(&r, "verb"), text(&r, "group"), text(&r, "resource"));
    let attributes = crate::rbac::Attributes {
        verb: &verb,
        group: &group,
        resource: &resource,
        subresource: Some(subresource.as_str()).filter(|s| !s.is_empty()),
        namespace: Some(namespace.as_str()).filter(|s| !s.is_empty()),
        name: Some(name.as_str()).filter(|s| !s.is_empty()),
    };
    let allowed = crate::rbac::allowed(&server.store, &user, &attributes);
    let reason = if allowed {
        "allowed by RBAC"
    } else {
        "no RBAC rule allows it"
    };
    json!({"kind": "SubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
           "metadata": {"creationTimestamp": null}, "spec": spec,
           "status": {"allowed": allowed, "reason": reason}})
}

/// A custom object shaped by its CRD version's schema: defaults filled in,
/// unknown fields pruned (refused under `fieldValidation=Strict`), values
/// validated (422 with a cause per field). Built-in kinds pass unchanged.
fn conform(
    kind: &Kind,
    mut object: Value,
    query: &BTreeMap<String, String>,
) -> Result<Value, ApiError> {
    if kind.group.is_empty() && kind.kind == "Secret" {
        merge_string_data(&mut object);
    }
    let Some(schema) = &kind.schema else {
        return Ok(object);
    };
    // Every object has these, whatever the schema says.
    let fixed: Vec<(&str, Option<Value>)> = ["apiVersion", "kind", "metadata"]
        .into_iter()
        .map(|k| (k, object.as_object_mut().and_then(|o| o.remove(k))))
        .collect();
    crate::schema::default(schema, &mut object);
    let unknown = crate::schema::prune(schema, &mut object, "");
    let strict = query.get("fieldValidation").is_some_and(|v| v == "Strict");
    if strict && !unknown.is_empty() {
        let fields: Vec<String> = unknown
            .iter()
            .map(|f| format!("unknown field \"{f}\""))
            .collect();
        return Err(ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
            fields.join(", "),
            kind = kind.kind,
            version = kind.version,
        )));
    }
    let name = fixed
        .iter()
        .find(|(k, _)| *k == "metadata")
        .and_then(|(_, m)| m.as_ref())
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let errors = crate::schema::validate(schema, &object, "");
    if !errors.is_empty() {
        return Err(ApiError::invalid(
            &format!("{}.{}", kind.kind, kind.group),
            &name,
            errors,
        ));
    }
    if let Some(map) = object.as_object_mut() {
        for (k, v) in fixed {
            if let Some(v) = v {
                map.insert(k.to_owned(), v);
            }
        }
    }
    Ok(object)
}

/// A Secret's `stringData` is write-only: the API server merges it into
/// `data` (base64), over keys of the same name, and never stores it.
fn merge_string_data(secret: &mut Value) {
    use base64::Engine;
    let Some(map) = secret.as_object_mut() else {
        return;
    };
    let Some(Value::Object(strings)) = map.remove("stringData") else {
        return;
    };
    let data = map
        .entry("data")
        .or_insert_with(|| Value::Object(serde_json::Map::new()));
    if let Some(data) = data.as_object_mut() {
        for (k, v) in strings {
            let text = v.as_str().unwrap_or_default();
            let encoded = base64::engine::general_purpose::STANDARD.encode(text);
            data.insert(k, Value::String(encoded));
        }
    }
}

/// The admission review of a write to `t` by `user`.
fn review<'a>(
    t: &'a Target,
    user: &'a User,
    operation: &'a str,
    name: &'a str,
    object: Option<&'a Value>,
    old_object: Option<&'a Value>,
) -> crate::admission::Review<'a> {
    crate::admission::Review {
        kind: &t.kind,
        subresource: t.subresource.as_deref(),
        namespace: t.namespace.as_deref().filter(|_| t.kind.namespaced),
        name,
        operation,
        user,
        object,
        old_object,
    }
}

/// Who is writing: the `fieldManager` parameter, as kubectl and kube-rs
/// send it.
fn manager(query: &BTreeMap<String, String>) -> &str {
    query.get("fieldManager").map_or("unknown", String::as_str)
}

/// A server-side apply's parameters.
fn applying<'a>(
    kind: &Kind,
    t: &'a Target,
    query: &'a BTreeMap<String, String>,
) -> crate::ssa::Apply<'a> {
    crate::ssa::Apply {
        manager: manager(query),
        force: flag(query, "force"),
        subresource: t.subresource.as_deref(),
        api_version: kind.api_version(),
    }
}

/// One object as the client asked for it: through `kind`'s version, as a
/// one-row Table if it asked for tables.
fn render(object: Value, kind: &Kind, table: Option<crate::table::Include>) -> Value {
    let object = as_version(object, kind);
    match table {
        Some(include) => {
            let rv = object["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            crate::table::table(kind, &[object], include, &rv)
        }
        None => object,
    }
}

/// The object as read through `kind`'s version (no conversion: the fields
/// are the same).
fn as_version(mut object: Value, kind: &Kind) -> Value {
    object["apiVersion"] = json!(kind.api_version());
    object
}

fn check_identity(object: &Value, kind: &Kind) -> Result<(), ApiError> {
    let api_version = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let k = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if (!api_version.is_empty() && api_version != kind.api_version())
        || (!k.is_empty() && k != kind.kind)
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({})",
            kind.api_version()
        )));
    }
    Ok(())
}

fn require_namespace(server: &Server, ns: &str) -> Result<(), ApiError> {
    let namespaces = crate::kinds::Resource {
        group: String::new(),
        plural: "namespaces".into(),
    };
    match server.store.get(&namespaces, "", ns) {
        Some(_) => Ok(()),
        None => Err(ApiError::not_found("", "namespaces", ns)),
    }
}

fn parse_object(body: &[u8], content_type: &str) -> Result<Value, ApiError> {
    if content_type.contains("yaml") {
        return crate::patch::yaml(body);
    }
    if content_type.contains("protobuf") || content_type.contains("cbor") {
        return Err(ApiError::unsupported_media_type(content_type));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

fn list(
    server: &Server,
    t: &Target,
    query: &BTreeMap<String, String>,
) -> Result<Response<Body>, ApiError> {
    let kind = &t.kind;
    let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))?;
    let fields = FieldSelector::parse(query.get("fieldSelector").map_or("", String::as_str))?;
    let (items, rv) = server.store.list(&kind.resource(), t.namespace.as_deref());
    let mut items: Vec<Value> = items
        .into_iter()
        .filter(|o| labels.matches(o) && fields.matches(o))
        .map(|o| as_version(o, kind))
        .collect();
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    // limit/continue: the continue token is the offset into the same
    // ordering (namespace, name) and the list's resourceVersion.
    let offset = match query.get("continue") {
        Some(token) => {
            let (at_rv, at) = token
                .split_once(':')
                .and_then(|(r, o)| Some((r.parse::<u64>().ok()?, o.parse::<usize>().ok()?)))
                .ok_or_else(|| ApiError::bad_request("invalid continue token"))?;
            metadata["resourceVersion"] = json!(at_rv.to_string());
            at
        }
        None => 0,
    };
    items = items.split_off(offset.min(items.len()));
    if let Some(limit) = query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0)
        && items.len() > limit
    {
        let rest = items.len() - limit;
        items.truncate(limit);
        let at_rv: u64 = metadata["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .unwrap_or(rv);
        metadata["continue"] = json!(format!("{at_rv}:{}", offset + limit));
        metadata["remainingItemCount"] = json!(rest);
    }
    if let Some(include) = t.table {
        let rv = metadata["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let mut table = crate::table::table(kind, &items, include, &rv);
        table["metadata"] = metadata;
        return Ok(json_ok(&table));
    }
    Ok(json_ok(&json!({
        "kind": format!("{}List", kind.kind),
        "apiVersion": kind.api_version(),
        "metadata": metadata,
        "items": items,
    })))
}

/// A watch: newline-delimited `{"type", "object"}` events, from the
/// requested resourceVersion (or the current objects as ADDED when there is
/// none), with bookmarks if asked, until `timeoutSeconds` or the server
/// stops. A resourceVersion older than the history gets a 410 ERROR event.
fn watch(
    server: &Arc<Server>,
    t: &Target,
    query: &BTreeMap<String, String>,
) -> Result<Response<Body>, ApiError> {
    let kind = t.kind.clone();
    let namespace = t.namespace.clone();
    let as_table = t.table;
    let render = move |object: Value, kind: &Kind| render(object, kind, as_table);
    let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))?;
    let fields = FieldSelector::parse(query.get("fieldSelector").map_or("", String::as_str))?;
    let bookmarks = flag(query, "allowWatchBookmarks");
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(Duration::from_secs(1800), Duration::from_secs);
    let from = query
        .get("resourceVersion")
        .filter(|r| !r.is_empty() && *r != "0")
        .map(|r| r.parse::<u64>());
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let matches = move |o: &Value| labels.matches(o) && fields.matches(o);
    let in_scope = {
        let resource = kind.resource();
        let namespace = namespace.clone();
        move |e: &Event| {
            e.resource == resource && namespace.as_ref().is_none_or(|n| *n == e.namespace)
        }
    };
    let (initial, backlog, mut changes, mut last_rv) = match from {
        Some(Err(_)) => return Err(ApiError::bad_request("resourceVersion: not a number")),
        Some(Ok(rv)) => match server.store.watch(rv) {
            Ok((backlog, changes)) => (Vec::new(), backlog, changes, rv),
            Err(gone) => {
                let line = watch_line("ERROR", &gone.status());
                let (tx, rx) = mpsc::channel(1);
                let _ = tx.try_send(line);
                return Ok(stream_response(rx));
            }
        },
        None => {
            let rv = server.store.resource_version();
            let (objects, at) = server.store.list(&kind.resource(), namespace.as_deref());
            let (backlog, changes) = server.store.watch(at.min(rv))?;
            (objects, backlog, changes, at)
        }
    };
    let shutdown: CancellationToken = server.shutdown.clone();
    let mut expiries = server.expiries();
    let open = server.clone();
    tokio::spawn(async move {
        open.metrics.watches.inc();
        let _closed = Closed(open);
        let send = |line: Bytes| tx.try_send(line).is_ok();
        for object in initial.into_iter().filter(|o| matches(o)) {
            if !send(watch_line("ADDED", &render(object, &kind))) {
                return;
            }
        }
        let deliver = |e: &Event| -> Option<Bytes> {
            if !in_scope(e) {
                return None;
            }
            let now = matches(&e.object);
            let before = e.previous.as_ref().is_some_and(&matches);
            let kind_name = match (e.kind, now, before) {
                (EventType::Added, true, _) => "ADDED",
                (EventType::Deleted, true, _) => "DELETED",
                (EventType::Modified, true, true) => "MODIFIED",
                (EventType::Modified, true, false) => "ADDED",
                (EventType::Modified, false, true) => "DELETED",
                _ => return None,
            };
            Some(watch_line(kind_name, &render(e.object.clone(), &kind)))
        };
        for e in backlog {
            last_rv = e.rv;
            if let Some(line) = deliver(&e)
                && !send(line)
            {
                return;
            }
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut ticks = tokio::time::interval(BOOKMARK_EVERY);
        ticks.tick().await;
        loop {
            tokio::select! {
                change = changes.recv() => match change {
                    Ok(e) => {
                        if e.rv <= last_rv { continue; }
                        last_rv = e.rv;
                        if let Some(line) = deliver(&e) && tx.send(line).await.is_err() { return; }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        let gone = ApiError::gone("the watch fell too far behind; list again");
                        let _ = tx.send(watch_line("ERROR", &gone.status())).await;
                        return;
                    }
                    Err(_) => return,
                },
                _ = ticks.tick(), if bookmarks => {
                    let mark = json!({"kind": kind.kind, "apiVersion": kind.api_version(),
                        "metadata": {"resourceVersion": last_rv.to_string()}});
                    if tx.send(watch_line("BOOKMARK", &mark)).await.is_err() { return; }
                }
                _ = expiries.changed() => {
                    let gone = ApiError::gone(format!("too old resource version: {last_rv}"));
                    let _ = tx.send(watch_line("ERROR", &gone.status())).await;
                    return;
                }
                () = &mut deadline => return,
                () = shutdown.cancelled() => return,
                () = tx.closed() => return,
            }
        }
    });
    Ok(stream_response(rx))
}

/// Counts a watch closed when dropped.
struct Closed(Arc<Server>);

impl Drop for Closed {
    fn drop(&mut self) {
        self.0.metrics.watches.dec();
    }
}

fn watch_line(kind: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

fn stream_response(rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    let mut r = Response::new(BodyExt::boxed_unsync(Channel(rx)));
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    r.headers_mut()
        .insert("transfer-encoding", HeaderValue::from_static("chunked"));
    r
}

/// A body made of what a channel carries, ending when its sender goes.
struct Channel(mpsc::Receiver<Bytes>);

impl hyper::body::Body for Channel {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.get_mut()
            .0
            .poll_recv(cx)
            .map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

/// Resolves a resource URL: `/api/v1/...` or `/apis/GROUP/VERSION/...`,
/// then `[namespaces/NS/]PLURAL[/NAME[/SUBRESOURCE]]`.
fn target(server: &Server, segments: &[&str]) -> Result<Target, ApiError> {
    let (group, version, rest) = match segments {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(ApiError::not_found("", "", &segments.join("/"))),
    };
    let namespaced_path = matches!(rest, ["namespaces", _, plural, ..] if server.kind(group, version, plural).is_some_and(|k| k.namespaced));
    let (namespace, rest) = if namespaced_path {
        (Some(rest[1].to_owned()), &rest[2..])
    } else {
        (None, rest)
    };
    let Some((plural, rest)) = rest.split_first() else {
        return Err(ApiError::not_found(group, "", ""));
    };
    let kind = server
        .kind(group, version, plural)
        .ok_or_else(|| ApiError::not_found(group, plural, ""))?;
    Ok(Target {
        kind,
        namespace,
        name: rest.first().map(|s| (*s).to_owned()),
        subresource: rest.get(1).map(|s| (*s).to_owned()),
        table: None,
    })
}

fn query(raw: Option<&str>) -> BTreeMap<String, String> {
    url::form_urlencoded::parse(raw.unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn flag(query: &BTreeMap<String, String>, name: &str) -> bool {
    query.get(name).is_some_and(|v| v == "1" || v == "true")
}

pub fn json_ok(value: &Value) -> Response<Body> {
    json_response(StatusCode::OK, value)
}

pub fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let mut r = Response::new(BodyExt::boxed_unsync(Full::new(Bytes::from(
        serde_json::to_vec(value).unwrap_or_default(),
    ))));
    *r.status_mut() = status;
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    r
}

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut r = Response::new(BodyExt::boxed_unsync(Full::new(Bytes::from_static(
        body.as_bytes(),
    ))));
    *r.status_mut() = status;
    r
}

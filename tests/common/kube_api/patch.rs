//! The two patch semantics the fake applies: RFC 7386 JSON merge patch (Events, and Nodes with
//! that content type) and the API server's strategic merge patch for Nodes (lists merged by
//! their Go types' `patchMergeKey`, e.g. `status.conditions` by `type`).

use serde_json::{json, Value};

/// RFC 7386 JSON merge patch.
pub(super) fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

/// Lists a strategic merge patch merges by key instead of replacing (from the Go types'
/// `patchMergeKey` tags, for the fields a Node patch may touch).
fn merge_key(path: &[&str]) -> Option<&'static str> {
    match path {
        ["status", "conditions"] | ["status", "addresses"] => Some("type"),
        ["status", "images"] => None,
        ["status", "volumesAttached"] => Some("name"),
        _ => None,
    }
}

/// A strategic merge patch as the API server applies it: maps merge (null deletes), lists with
/// a merge key merge element by element (an element of the patch replaces the fields it names in
/// the element with the same key, or is appended), every other list is replaced. Directives
/// (`$patch`, `$retainKeys`, `$setElementOrder`, `$deleteFromPrimitiveList`) are refused: the
/// agent does not send them and the fake does not pretend to know them.
pub(super) fn strategic_merge(
    target: &mut Value,
    patch: &Value,
    path: &mut Vec<String>,
) -> Result<(), String> {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in p {
                if k.starts_with('$') {
                    return Err(format!("patch directive {k} is not served by the fake"));
                }
                if v.is_null() {
                    t.remove(k);
                    continue;
                }
                path.push(k.clone());
                let keys: Vec<&str> = path.iter().map(String::as_str).collect();
                let entry = t.entry(k.clone()).or_insert(Value::Null);
                match (merge_key(&keys), v) {
                    (Some(key), Value::Array(items)) => {
                        if !entry.is_array() {
                            *entry = json!([]);
                        }
                        let list = entry.as_array_mut().unwrap();
                        for item in items {
                            if item.get("$patch").is_some() {
                                return Err(
                                    "patch directive $patch is not served by the fake".into()
                                );
                            }
                            let Some(id) = item.get(key).filter(|id| !id.is_null()) else {
                                return Err(format!(
                                    "map list element without its merge key {key}"
                                ));
                            };
                            match list.iter_mut().find(|e| e.get(key) == Some(id)) {
                                Some(existing) => strategic_merge(existing, item, &mut Vec::new())?,
                                None => list.push(item.clone()),
                            }
                        }
                    }
                    _ => strategic_merge(entry, v, path)?,
                }
                path.pop();
            }
            Ok(())
        }
        _ => {
            *target = patch.clone();
            Ok(())
        }
    }
}

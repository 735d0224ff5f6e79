"""Bring the cut descriptions up to the newest published ones, and derive the 2026-03-10 subset.

Run after slice_rest.py and slice_webhooks.py (see PROVENANCE.md). The newest description,
github/rest-api-description's descriptions-next/api.github.com/api.github.com.2026-03-10.json
(13 MB; the repository is too large to fetch here, and the newest @octokit/openapi, 23.0.2,
still carries 2022-11-28 only), is read through githubkit-schemas 26.10.21, whose models are
generated from it (commit 755ee33b, versions.lock of the package): every difference between those
models and the cut subsets, for the schemas the subsets hold, is one entry below. Idempotent.

    python3 patch_newer.py github-rest-subset.json github-webhooks-subset.json \
            github-rest-subset-2026-03-10.json
"""
import copy, json, sys

ARCHIVED_AT = {"description": "Timestamp indicating when the label was archived, or `null` if "
               "it has not been archived.", "type": "string", "format": "date-time",
               "nullable": True}
# githubkit types the REST label's archived_by as None: only null is described
ARCHIVED_BY_REST = {"description": "The user who archived the label, or `null` if it has not "
                    "been archived.", "type": "object", "nullable": True, "enum": [None]}
# ... and the webhooks' as a user object or null (OpenAPI 3.1 here)
ARCHIVED_BY_HOOK = {"description": "The user who archived the label, or `null` if it has not "
                    "been archived.", "type": ["object", "null"],
                    "properties": {"login": {"type": "string"}, "id": {"type": "integer"},
                                   "node_id": {"type": "string"},
                                   "avatar_url": {"type": "string", "format": "uri"}},
                    "required": ["login", "id", "node_id", "avatar_url"]}

# (schema, JSON path inside it as a list, property, property schema, required?)
REST_ADD = [
    ("label", [], "archived_at", ARCHIVED_AT, True),
    ("label", [], "archived_by", ARCHIVED_BY_REST, True),
    ("issue", ["properties", "labels", "items", "oneOf", 1], "archived_by", ARCHIVED_BY_REST,
     False),
    ("issue-search-result-item", ["properties", "labels", "items"], "archived_at", ARCHIVED_AT,
     False),
    ("issue-search-result-item", ["properties", "labels", "items"], "archived_by",
     ARCHIVED_BY_REST, False),
    ("app-permissions", [], "organization_copilot_requests",
     {"type": "string", "enum": ["read"], "description": "The level of permission to grant "
      "the access token to make Copilot requests billed to the organization where the app is "
      "installed. This property is in public preview and is subject to change."}, False),
    ("app-permissions", [], "organization_external_properties_for_repos",
     {"type": "string", "enum": ["read", "write", "admin"], "description": "The level of "
      "permission to grant the access token for managing external custom properties for "
      "repositories in an organization."}, False),
]
HOOK_ADD = [
    ("webhooks_label", [], "archived_at", dict(ARCHIVED_AT, type=["string", "null"],
                                               nullable=None), True),
    ("webhooks_label", [], "archived_by", ARCHIVED_BY_HOOK, True),
    ("webhook-issues-labeled", ["properties", "issue", "properties", "labels", "items"],
     "archived_at", dict(ARCHIVED_AT, type=["string", "null"], nullable=None), True),
    ("webhook-issues-labeled", ["properties", "issue", "properties", "labels", "items"],
     "archived_by", ARCHIVED_BY_HOOK, True),
]
# 2026-03-10's breaking changes within the subset: (schema, property)
REMOVED_2026 = [
    ("issue", "assignee"), ("nullable-issue", "assignee"),
    ("issue-search-result-item", "assignee"),
    ("rate-limit-overview", "rate"),
    ("repository", "has_downloads"), ("repository", "master_branch"),
    ("repository", "use_squash_pr_title_as_default"),
    ("nullable-repository", "has_downloads"), ("nullable-repository", "master_branch"),
    ("nullable-repository", "use_squash_pr_title_as_default"),
    ("full-repository", "has_downloads"), ("full-repository", "use_squash_pr_title_as_default"),
    ("minimal-repository", "has_downloads"), ("nullable-minimal-repository", "has_downloads"),
]
# ... and request bodies that lost a property in 2026-03-10: (path, method, property)
REMOVED_2026_REQUEST = [
    ("/repos/{owner}/{repo}/issues", "post", "assignee"),
    ("/repos/{owner}/{repo}/issues/{issue_number}", "patch", "assignee"),
]


def _node(schemas, name, path):
    node = schemas[name]
    for step in path:
        node = node[step]
    return node


def _add(schemas, entries):
    n = 0
    for name, path, prop, sch, required in entries:
        if name not in schemas:
            continue
        node = _node(schemas, name, path)
        clean = {k: v for k, v in sch.items() if v is not None}
        if node.setdefault("properties", {}).get(prop) != clean:
            node["properties"][prop] = clean
            n += 1
        if required and prop not in node.setdefault("required", []):
            node["required"].append(prop)
            n += 1
    return n


# which example objects stand for which schema: (property, a key only that kind of object has)
EXAMPLE_KINDS = [("assignee", "assignees"), ("rate", "resources"), ("has_downloads", "full_name"),
                 ("master_branch", "full_name"), ("use_squash_pr_title_as_default", "full_name")]


def _strip_examples(obj):
    n = 0
    if isinstance(obj, dict):
        for prop, marker in EXAMPLE_KINDS:
            if prop in obj and marker in obj:
                del obj[prop]
                n += 1
        for v in obj.values():
            n += _strip_examples(v)
    elif isinstance(obj, list):
        for v in obj:
            n += _strip_examples(v)
    return n


def main(rest_path, hooks_path, rest_2026_path):
    rest = json.load(open(rest_path))
    hooks = json.load(open(hooks_path))
    changed = _add(rest["components"]["schemas"], REST_ADD)
    changed += _add(hooks["components"]["schemas"], HOOK_ADD)
    v2026 = copy.deepcopy(rest)
    v2026["info"] = dict(v2026["info"], **{"x-api-version": "2026-03-10"})
    removed = 0
    for name, prop in REMOVED_2026:
        sch = v2026["components"]["schemas"].get(name)
        if sch is None or prop not in sch.get("properties", {}):
            continue
        del sch["properties"][prop]
        if prop in sch.get("required", []):
            sch["required"].remove(prop)
        removed += 1
    # GitHub's example responses, which the suite reads as documentation of fields, lose them too
    removed += _strip_examples(v2026["components"].get("examples", {}))
    for path, method, prop in REMOVED_2026_REQUEST:
        body = v2026["paths"][path][method]["requestBody"]["content"]["application/json"]
        body["schema"]["properties"].pop(prop, None)
        removed += 1
    for obj, path in ((rest, rest_path), (hooks, hooks_path), (v2026, rest_2026_path)):
        json.dump(obj, open(path, "w"), separators=(",", ":"), sort_keys=True)
    print(f"{changed} additions from the newest description; 2026-03-10: {removed} removals "
          f"-> {rest_2026_path}")


if __name__ == "__main__":
    main(*sys.argv[1:4])

"""GET /v1/datasets/{id}/rejects: every reject of an ingest, a page at a time, in
input order, with a cursor that reads only the page (the dataset's `rejected_sample` holds 20)."""

from __future__ import annotations

import json

from tests.service.test_datasets import _ready


def test_rejects_are_paged_in_input_order_with_checked_cursors(api, worker, home):
    lines = []
    for i in range(1, 1201):
        lines.append('{"prompt": ' if i % 4 == 0 else json.dumps({"prompt": f"p{i}"}))
    src = home / "data" / "rejects-paging.jsonl"
    src.write_text("\n".join(lines) + "\n")
    d = _ready(api, api.post("/v1/datasets", {"name": "rj", "path": str(src)}).json()["id"])
    assert d["status"] == "ready" and d["num_rejected"] == 300 and len(d["rejected_sample"]) == 20

    got, after, pages = [], None, 0
    while True:
        r = api.get(f"/v1/datasets/{d['id']}/rejects",
                    params={"limit": 128, **({"after": after} if after else {})})
        assert r.status_code == 200, r.text
        body = r.json()
        got += body["data"]
        pages += 1
        assert body["has_more"] == (body["next_after"] is not None)
        if not body["has_more"]:
            break
        after = body["next_after"]
    assert pages == 3 and [x["line"] for x in got] == list(range(4, 1201, 4))
    assert all("invalid JSON" in x["reason"] for x in got)

    # A cursor that is not one the endpoint gave: 422 naming `after`, never a 500.
    for bad in ("7", "abc", "-1", "99999999999999999999"):
        r = api.get(f"/v1/datasets/{d['id']}/rejects", params={"after": bad})
        assert r.status_code == 422 and r.json()["error"]["param"] == "after", (bad, r.text)
    assert api.get(f"/v1/datasets/{d['id']}/rejects", params={"limit": 0}).status_code == 422
    assert api.get("/v1/datasets/ds_nope/rejects").status_code == 404

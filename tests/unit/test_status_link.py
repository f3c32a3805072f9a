"""The status link of ``POST /batches`` is what ``urlencode`` would give, built
without quoting a long id list character by character."""

from __future__ import annotations

import json
from types import SimpleNamespace
from urllib.parse import urlencode

from aiohttp.test_utils import make_mocked_request
from hypothesis import given
from hypothesis import strategies as st

from ledgerq.ingest.api import _status_link

hex_ids = st.text(alphabet="0123456789abcdef", min_size=128, max_size=128)
service_ids = st.none() | st.text(min_size=1, max_size=40)


@given(st.lists(hex_ids, min_size=1, max_size=30), service_ids)
def test_the_link_is_urlencodes(ids: list[str], service_id: str | None) -> None:
    request = make_mocked_request("POST", "/batches", headers={"Host": "gw:8080"})
    batches = [SimpleNamespace(batch_id=i) for i in ids]
    link = json.loads(_status_link(request, batches, service_id).text)["link"]
    query = {"id": ",".join(ids)}
    if service_id is not None:
        query["service_id"] = service_id
    assert link == f"http://gw:8080/batch_statuses?{urlencode(query)}"

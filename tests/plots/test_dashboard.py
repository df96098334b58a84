"""The Dask dashboard of a sweep's local cluster answers (bokeh, declared in the sweep extra)."""

import urllib.parse
import urllib.request

import pytest

pytest.importorskip("distributed")
pytest.importorskip("bokeh", reason="the dashboard needs bokeh (pip install 'sinkflow[sweep]')")


@pytest.mark.timeout(120)
def test_local_client_dashboard_link_answers_over_loopback():
    from sinkflow.sweeps._executors import local_client

    client = local_client(n_workers=1)
    try:
        link = client.dashboard_link
        port = urllib.parse.urlsplit(link).port
        assert port, f"no port in the dashboard link {link!r}"
        url = urllib.parse.urlunsplit(("http", f"127.0.0.1:{port}", urllib.parse.urlsplit(link).path, "", ""))
        with urllib.request.urlopen(url, timeout=30) as response:
            page = response.read().decode("utf-8", "replace")
            assert response.status == 200
        assert "bokeh" in page.lower(), "the dashboard page is served by bokeh"
    finally:
        client.close()
        client.cluster.close()

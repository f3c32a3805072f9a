-- wrk script: replays requests prepared by bench/load.py, each thread its own share.
-- Arguments: INDEX_FILE BLOB_FILE THREADS METHOD
--   INDEX_FILE lines: "<n> <path> <offset> <length>" (body bytes in BLOB_FILE)
-- done() prints one JSON line with the figures bench/load.py reads.

local next_tid = 0

function setup(thread)
  thread:set("tid", next_tid)
  next_tid = next_tid + 1
end

function init(args)
  local index, blob, threads, method = args[1], args[2], tonumber(args[3]), args[4]
  local f = assert(io.open(blob, "rb"))
  local data = f:read("*a")
  f:close()
  local headers = {}
  if method == "POST" then
    headers["Content-Type"] = "application/octet-stream"
  end
  reqs = {}
  for line in io.lines(index) do
    local n, path, off, len = line:match("^(%d+) (%S+) (%d+) (%d+)$")
    if n and tonumber(n) % threads == tid then
      local body = nil
      if tonumber(len) > 0 then
        body = data:sub(tonumber(off) + 1, tonumber(off) + tonumber(len))
      end
      reqs[#reqs + 1] = wrk.format(method, path, headers, body)
    end
  end
  pos = 0
  wrapped = 0
end

function request()
  pos = pos + 1
  if pos > #reqs then
    pos = 1
    wrapped = wrapped + 1
  end
  return reqs[pos]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"non2xx":%d,"socket_errors":%d,' ..
    '"p50_us":%.1f,"p90_us":%.1f,"p99_us":%.1f,"max_us":%.1f,"mean_us":%.1f}\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
end

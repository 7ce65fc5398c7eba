"""SupabaseStore and AsyncSupabaseStore: the JobStore over PostgREST RPC, with supabase-py's sync or async
client and the secret (service-role) key. Both run ``pgjobkit.ops`` calls as ``POST /rest/v1/rpc/jobkit_*``;
``rpc`` holds what they share, ``store_async`` the async store and ``store`` its blocking twin, generated
from it (tools/async_to_sync.py); how faults are retried and mapped is ``http``'s, wake-ups ``realtime``'s.

PostgREST cuts a set-returning answer at the project's max-rows (1000 on Supabase) while the function
runs to completion, so no call asks for more: claims and completions are split to fit, requeue, stats and
lease reclaim page, and ``enqueue_many`` calls ``jobkit_enqueue_many_ids_json``, whose one JSON value answers
for every job of an all-or-nothing batch of up to 10,000. Give ``max_rows`` if the project's Max Rows setting
(Settings -> API) was lowered.

What a retried call means: the first attempt may have run before its answer was lost (a gateway's 502 or
504, a dropped connection). A retried claim then leaves the jobs it leased running until their lease
expires, when they are reclaimed: delivery stays at-least-once. A retried enqueue without an idempotency
key may insert twice; give a key when that matters. complete / fail / extend are fenced by the lease
token, so a repeat changes nothing.
"""

from pgjobkit.stores.supabase._http_base import RetryPolicy
from pgjobkit.stores.supabase.store import SupabaseStore
from pgjobkit.stores.supabase.store_async import AsyncSupabaseStore

__all__ = ["AsyncSupabaseStore", "RetryPolicy", "SupabaseStore"]

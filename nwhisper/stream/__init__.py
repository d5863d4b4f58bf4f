"""Live streams: audio arriving in pieces, cut into utterances, each answered by a final.

    settings.py   StreamSettings: what a client may set (rate, pause, drafts …), checked
    door.py       how a stream reaches the model: submit(job, priority) → Future, abandon;
                  FINAL before DRAFT; the jobs (final_job)
    live.py       LiveStream: the resampler, the endpointer, speculative finals, drafts, finals
                  in order, commit/reset/end; commit mode (turns off)

No transport here (asyncio only, no Tornado): each dialect of the server (the seed WebSocket,
OpenAI Realtime, Wyoming) is an adapter that feeds a LiveStream and translates its messages.
"""

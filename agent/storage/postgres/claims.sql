-- A won claim in one statement: the server-side half of agent/storage/postgres/claims.py.
--
-- Each function does, in the caller's one statement (autocommit: one statement is one
-- transaction, one round trip), exactly what ClaimRows.claim (agent/storage/sql/claims.py)
-- does in its transaction when the execution insert wins: the same statements, in the same
-- order, taking the same locks. Each statement here reads with a fresh snapshot (READ
-- COMMITTED, VOLATILE functions), as the separate statements of that transaction do.
--
-- A lost insert writes nothing and returns the record it lost to (won = false), for the
-- caller to decide the race on; a takeover is always the caller's general path. A race with
-- another worker's transaction is decided here as there, by UNIQUE(work_key): a thread that
-- got its task meanwhile has the message join that task. What the general path handles and
-- these functions do not - a task row or a task record they cannot read - raises SQLSTATE
-- OL001: the whole statement rolls back, and the caller runs the general path instead.
--
-- Installed by PostgresStore at open, in the store's schema, inside the migration
-- transaction. The _v1 suffix names the signature and the body: a change to either is a new
-- name, so processes of an older release keep calling theirs while a newer one starts. The
-- file is sent as it is, in one simple query (no placeholders are substituted in it).

CREATE OR REPLACE FUNCTION outloop_claim_task_v1(
    -- the execution record (ClaimRequest, and the claim's time and lease)
    p_key text,
    p_service text,
    p_holder text,
    p_lease_expires_at double precision,
    p_run_id text,
    p_item_ref text,
    p_claimed_at double precision,
    -- the TaskDraft
    p_work_key text,
    p_task_id text,
    p_workspace_id text,
    p_provider text,
    p_mailbox_id text,
    p_link_message_ids text[],
    -- the new task, built by the caller (ClaimRows._new_task): its columns and its record
    p_task_state text,
    p_task_terminal integer,
    p_task_received_at double precision,
    p_task_record text,
    -- the message, and the record's new updated_at, each serialized as the record holds it
    p_message text,
    p_provider_message_id text,
    p_internet_message_id text,
    p_message_received_at double precision,
    p_updated_at text,
    -- won: the insert won; task_record: the task's record, NULL when it is p_task_record
    OUT won boolean,
    OUT task_record text,
    OUT execution executions
) LANGUAGE plpgsql AS $$
DECLARE
    v_task_id text;      -- the task the message joins
    v_by_work_key boolean := true;
    v_linked text[];
    v_record jsonb;      -- the task's record, for reading
BEGIN
    -- The claim names the thread's task if the thread has one, else the new task's id.
    INSERT INTO executions AS e (key, service, holder, state, generation, lease_expires_at,
                                 run_id, item_ref, claimed_at, task_id)
    VALUES (p_key, p_service, p_holder, 'CLAIMED', 1, p_lease_expires_at, p_run_id,
            p_item_ref, p_claimed_at,
            coalesce((SELECT h.task_id FROM task_threads h WHERE h.work_key = p_work_key),
                     p_task_id))
    ON CONFLICT (key) DO NOTHING
    RETURNING * INTO execution;
    won := FOUND;
    IF NOT won THEN
        SELECT * INTO execution FROM executions e WHERE e.key = p_key;
        RETURN;
    END IF;

    IF execution.task_id <> p_task_id THEN
        v_task_id := execution.task_id;  -- the thread's task, found by the work key
    ELSIF cardinality(p_link_message_ids) > 0 THEN
        -- Exact linkage only: ids naming messages of two different tasks link nothing.
        SELECT array_agg(l.task_id) INTO v_linked FROM (
            SELECT DISTINCT m.task_id FROM task_messages m
            WHERE m.workspace_id = p_workspace_id AND m.provider = p_provider
              AND m.mailbox_id = p_mailbox_id
              AND m.internet_message_id = ANY (p_link_message_ids)
            LIMIT 2
        ) l;
        IF cardinality(v_linked) = 1 THEN
            v_task_id := v_linked[1];
            v_by_work_key := false;
        END IF;
    END IF;

    IF v_task_id IS NULL THEN
        -- No task for the thread: this claim creates it.
        INSERT INTO tasks (task_id, workspace_id, work_key, state, terminal, received_at, record)
        VALUES (p_task_id, p_workspace_id, p_work_key, p_task_state, p_task_terminal,
                p_task_received_at, p_task_record);
        INSERT INTO task_threads (work_key, task_id) VALUES (p_work_key, p_task_id)
        ON CONFLICT (work_key) DO NOTHING;
        IF FOUND THEN
            INSERT INTO task_messages (workspace_id, provider, mailbox_id, internet_message_id,
                                       provider_message_id, task_id, received_at)
            VALUES (p_workspace_id, p_provider, p_mailbox_id, p_internet_message_id,
                    p_provider_message_id, p_task_id, p_message_received_at)
            ON CONFLICT DO NOTHING;
            RETURN;
        END IF;
        -- Another worker's transaction created this thread's task first; UNIQUE(work_key)
        -- decided it. Use that task instead.
        DELETE FROM tasks t WHERE t.task_id = p_task_id;
        SELECT h.task_id INTO v_task_id FROM task_threads h WHERE h.work_key = p_work_key;
    ELSIF NOT v_by_work_key THEN
        -- Found by exact linkage: point the thread at that task, unless another worker's
        -- transaction gave the thread its own task first - then the message joins that one.
        INSERT INTO task_threads (work_key, task_id) VALUES (p_work_key, v_task_id)
        ON CONFLICT (work_key) DO NOTHING;
        IF NOT FOUND THEN
            SELECT h.task_id INTO v_task_id FROM task_threads h WHERE h.work_key = p_work_key;
        END IF;
    END IF;
    IF v_task_id IS NULL THEN
        RAISE EXCEPTION 'thread % has no task after a conflict', p_work_key
            USING ERRCODE = 'OL001';
    END IF;

    -- Add the message to the task's record, unless the record holds it already. The checks
    -- read the record as jsonb (parsed once); the record is rebuilt from its own text.
    SELECT t.record INTO task_record FROM tasks t WHERE t.task_id = v_task_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'task % does not exist', v_task_id USING ERRCODE = 'OL001';
    END IF;
    v_record := task_record::jsonb;
    IF jsonb_typeof(v_record -> 'messages') IS DISTINCT FROM 'array'
       OR v_record -> 'updated_at' IS NULL THEN
        RAISE EXCEPTION 'the record of task % has no messages or updated_at', v_task_id
            USING ERRCODE = 'OL001';
    END IF;
    IF NOT v_record -> 'messages' @> jsonb_build_array(
           jsonb_build_object('provider_message_id', p_provider_message_id)) THEN
        -- Field by field, in the record's own order: each value's own text (json, unlike
        -- jsonb, keeps it byte for byte) except the two that change. The result is the text
        -- the caller's serializer writes for the updated task.
        SELECT '{' || string_agg(
                   to_json(f.key)::text || ':' || CASE f.key
                       WHEN 'messages' THEN
                           CASE WHEN json_array_length(f.value) = 0
                                THEN '[' || p_message || ']'
                                ELSE left(f.value::text, -1) || ',' || p_message || ']'
                           END
                       WHEN 'updated_at' THEN p_updated_at
                       ELSE f.value::text
                   END,
                   ',' ORDER BY f.n) || '}'
        INTO task_record
        FROM json_each(task_record::json) WITH ORDINALITY AS f (key, value, n);
        UPDATE tasks t SET state = v_record ->> 'state', record = task_record
        WHERE t.task_id = v_task_id;
    END IF;
    INSERT INTO task_messages (workspace_id, provider, mailbox_id, internet_message_id,
                               provider_message_id, task_id, received_at)
    VALUES (p_workspace_id, p_provider, p_mailbox_id, p_internet_message_id,
            p_provider_message_id, v_task_id, p_message_received_at)
    ON CONFLICT DO NOTHING;
    IF execution.task_id <> v_task_id THEN
        UPDATE executions e SET task_id = v_task_id WHERE e.key = p_key
        RETURNING * INTO execution;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION outloop_claim_escalation_v1(
    -- the execution record (ClaimRequest, and the claim's time and lease)
    p_key text,
    p_service text,
    p_holder text,
    p_lease_expires_at double precision,
    p_run_id text,
    p_item_ref text,
    p_claimed_at double precision,
    -- the EscalationDraft
    p_scope text,
    p_queue text,
    p_assignee text,
    p_reason text,
    p_provider text,
    p_mailbox_id text,
    p_escalated_item_ref text,
    OUT won boolean,
    OUT task_record text,  -- always NULL: an escalation has no task
    OUT execution executions
) LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO executions AS e (key, service, holder, state, generation, lease_expires_at,
                                 run_id, item_ref, claimed_at, task_id)
    VALUES (p_key, p_service, p_holder, 'CLAIMED', 1, p_lease_expires_at, p_run_id,
            p_item_ref, p_claimed_at, NULL)
    ON CONFLICT (key) DO NOTHING
    RETURNING * INTO execution;
    won := FOUND;
    IF NOT won THEN
        SELECT * INTO execution FROM executions e WHERE e.key = p_key;
        RETURN;
    END IF;
    INSERT INTO escalations (occurrence_key, scope, queue, assignee, reason, provider,
                             mailbox_id, item_ref, created_at)
    VALUES (p_key, p_scope, p_queue, p_assignee, p_reason, p_provider, p_mailbox_id,
            p_escalated_item_ref, p_claimed_at)
    ON CONFLICT DO NOTHING;
END
$$;

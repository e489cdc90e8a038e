"""The request parser: clauses, order, parallel work, fan-out, modifiers, conditions, hooks,
loops, tuning and schedules — each read from English structure, not from fixed sentences."""

from __future__ import annotations

import pytest

from couler.generate.parse import parse_request


def _tasks(text: str) -> list[tuple[str, int]]:
    return [(t.verb, t.stage) for t in parse_request(text).tasks]


@pytest.mark.parametrize(("text", "cron"), [
    ("Every Tuesday at 7:30 pm, refresh the features.", "30 19 * * 2"),
    ("Refresh the features every 15 minutes.", "*/15 * * * *"),
    ("Every 4 hours, pull the logs and score them.", "0 */4 * * *"),
    ("Nightly at 23:10 UTC, retrain the ranker.", "10 23 * * *"),
    ("On the 15th of every month at 06:00, rebuild the index.", "0 6 15 * *"),
    ("Every day at 5am, export the table.", "0 5 * * *"),
    ("Run hourly: pull metrics and detect anomalies.", "0 * * * *"),
])
def test_schedules_become_cron(text: str, cron: str) -> None:
    assert parse_request(text).schedule == cron


def test_an_adjective_is_not_a_schedule() -> None:
    # "hourly" describes the data here, it does not schedule the workflow
    assert parse_request("Forecast hourly demand with Prophet.").schedule == ""


def test_sequence_words_order_the_clauses() -> None:
    text = ("Download the logs from https://x.example/logs.csv, clean them, and then fit an "
            "isolation forest. After that, post the outliers to Slack.")
    assert _tasks(text) == [("download", 0), ("clean", 1), ("fit", 2), ("post", 3)]


def test_a_coordinated_list_of_models_is_parallel_work() -> None:
    tasks = parse_request("Train a gradient boosting model and a logistic regression "
                          "simultaneously on the churn table, then compare them.").tasks
    assert [t.stage for t in tasks] == [0, 0, 1]
    assert {t.obj for t in tasks[:2]} == {"gradient boosting model on the churn table",
                                          "logistic regression on the churn table"}


def test_a_list_of_names_fans_out() -> None:
    task = parse_request("Retrain the demand model for Berlin, Paris, Madrid and Rome in "
                         "parallel, with at most 2 running at once.").tasks[0]
    assert task.items == ("Berlin", "Paris", "Madrid", "Rome")
    assert task.max_parallel == 2


def test_a_count_fans_out_after_a_split() -> None:
    tasks = parse_request("Split the corpus into 12 shards and tokenize each shard with "
                          "3 retries, then merge the shards.").tasks
    assert tasks[0].shards == 12
    assert tasks[1].items == tuple(str(i) for i in range(12)) and tasks[1].retries == 3
    assert tasks[2].items == ()  # merging ends the fan-out


@pytest.mark.parametrize(("text", "gpu", "memory", "timeout"), [
    ("Fine-tune BERT with 2 A100s and 64Gi of memory.", 2, "64Gi", 0),
    ("Train the detector on a single GPU with a 90-minute timeout.", 1, "", 5400),
    ("Embed the documents on the GPU; it must not run longer than 2 hours.", 1, "", 7200),
    ("Train the model with 16 GB of RAM and a 3 hour limit.", 0, "16Gi", 10800),
])
def test_resources_and_timeouts(text: str, gpu: int, memory: str, timeout: int) -> None:
    task = parse_request(text).tasks[0]
    assert (task.gpu, task.memory, task.timeout) == (gpu, memory, timeout)


def test_a_sentence_of_modifiers_applies_to_the_step_it_names() -> None:
    tasks = parse_request("Scrape the product pages, then summarize them with an LLM. "
                          "The scraper is flaky, so retry it 6 times.").tasks
    assert [t.retries for t in tasks] == [6, 0]


def test_condition_and_else_branch() -> None:
    tasks = parse_request("Train the classifier and evaluate its recall. If recall is below "
                          "0.6, page the data team; otherwise deploy it to staging.").tasks
    page, deploy = tasks[-2], tasks[-1]
    assert page.condition is not None and deploy.condition is not None
    assert (page.condition.op, page.condition.value, page.condition.otherwise) == ("<", "0.6",
                                                                                  False)
    assert deploy.condition.otherwise and page.stage == deploy.stage


def test_trailing_only_if_condition() -> None:
    task = parse_request("Score the holdout, and publish the model only if AUC exceeds "
                         "0.91.").tasks[-1]
    assert task.condition is not None
    assert (task.condition.metric, task.condition.op, task.condition.value) == ("AUC", ">",
                                                                                "0.91")


@pytest.mark.parametrize(("text", "hook", "verb"), [
    ("Train the model. If the pipeline fails, email ops@example.com.", "failure", "email"),
    ("Train the model. Should anything fail, notify #ml-oncall on Slack.", "failure", "notify"),
    ("Train the model. Regardless of the result, delete the scratch bucket.", "exit", "delete"),
])
def test_exit_hooks(text: str, hook: str, verb: str) -> None:
    last = parse_request(text).tasks[-1]
    assert (last.hook, last.verb) == (hook, verb)


def test_loop_until_a_metric_or_a_round_limit() -> None:
    task = parse_request("Fine-tune the ResNet in rounds of 2 epochs; after each round "
                         "measure top-1 accuracy and stop once it reaches 0.9 or after the "
                         "5th round.").tasks[0]
    assert task.loop_max == 5
    assert task.loop_until is not None and task.loop_until.value == "0.9"


def test_tuning_and_separate_trial_jobs() -> None:
    tuned = parse_request("Tune a CatBoost model with 40 trials of random search.").tasks[0]
    assert (tuned.tune_trials, tuned.tune_sampler, tuned.items) == (40, "random", ())
    jobs = parse_request("Run 20 hyperparameter trials of the ranker as separate jobs, 5 at a "
                         "time.").tasks[0]
    assert len(jobs.items) == 20 and jobs.max_parallel == 5 and jobs.tune_trials == 0


def test_context_sentences_are_not_steps() -> None:
    parsed = parse_request("Our clickstream lands in s3://lake/clicks/. Sessionize it and "
                           "train a GRU4Rec model.")
    assert [t.verb for t in parsed.tasks] == ["sessionize", "train"] or \
        [t.verb for t in parsed.tasks][-1] == "train"
    assert parsed.sources == ["s3://lake/clicks/"]


@pytest.mark.parametrize("text", [
    "Publish the model to the registry, but only if its AUC is above 0.8.",
    "Publish the model to the registry. Only if AUC is above 0.8.",
])
def test_a_condition_alone_qualifies_the_action_before_it(text: str) -> None:
    [task] = parse_request(text).tasks
    assert task.verb == "publish" and task.condition is not None
    assert (task.condition.op, task.condition.value) == (">", "0.8")


def test_a_bare_condition_with_its_own_action_is_not_moved_back() -> None:
    tasks = parse_request("Fine-tune a ViT on the images, and if top-1 accuracy beats 0.92 "
                          "deploy it to staging.").tasks
    assert [t.verb for t in tasks] == ["fine-tune", "deploy"]
    assert tasks[0].condition is None and tasks[1].condition is not None


def test_keep_doing_until_and_a_bound_given_later() -> None:
    [task] = parse_request("Keep retraining the ranker on new clicks until NDCG reaches 0.4; "
                           "give up after 6 attempts.").tasks
    assert task.verb == "retrain"
    assert task.loop_max == 6 and task.loop_until is not None
    assert (task.loop_until.metric, task.loop_until.op) == ("NDCG", ">=")
    # no bound at all: the default one, the goal read from "until", not from "at most"
    [task] = parse_request("Repeat training until accuracy reaches 0.9.").tasks
    assert task.loop_max == 10 and task.loop_until is not None
    [task] = parse_request("Keep tuning the prompts until the score is above 0.7, at most "
                           "4 rounds.").tasks
    assert task.loop_max == 4 and task.loop_until is not None
    assert task.loop_until.metric == "the score"


@pytest.mark.parametrize(("text", "retries"), [
    ("Score the 20 shards in parallel and retry each shard twice.", 2),
    ("Upload the report and retry it thrice.", 3),
])
def test_retry_counts_in_words(text: str, retries: int) -> None:
    assert max(t.retries for t in parse_request(text).tasks) == retries


def test_a_command_name_before_its_verb() -> None:
    tasks = parse_request("Run dvc repro, then dvc push the outputs to the remote.").tasks
    assert [t.verb for t in tasks] == ["run", "push"]
    assert "dvc" in tasks[1].obj


def test_a_request_per_item_fans_the_step_out() -> None:
    [task, _] = parse_request("Transcribe the calls for Q1, Q2 and Q3 with Whisper, one GPU "
                              "per quarter, then summarize them.").tasks
    assert task.items == ("Q1", "Q2", "Q3") and task.gpu == 1


def test_frames_and_failure_hooks_in_other_words() -> None:
    tasks = parse_request("Can you set up a job that extracts embeddings with SpeechBrain and "
                          "then clusters them? If any of it fails, page the on-call.").tasks
    assert [(t.verb, t.hook) for t in tasks] == [("extract", ""), ("cluster", ""),
                                                 ("page", "failure")]


@pytest.mark.parametrize(("text", "cron"), [
    ("nightly 03:10: pull the clicks -> train the model -> push the weights", "10 3 * * *"),
    ("twice a day at 9 and 21, pull the reviews and cluster them", "0 9,21 * * *"),
    ("A weekly retrain (Mondays 04:00): extract the logs, then train the ranker.",
     "0 4 * * 1"),
    ("Every day at 6, score the table.", "0 6 * * *"),
])
def test_clock_times_next_to_a_schedule(text: str, cron: str) -> None:
    assert parse_request(text).schedule == cron


def test_a_daily_table_is_no_schedule() -> None:
    assert parse_request("Backfill the daily user-embedding table for 2023.").schedule == ""


def test_arrows_order_the_steps() -> None:
    assert _tasks("pull clickstream from Kafka -> train a CTR model -> push weights to "
                  "Aerospike") == [("pull", 0), ("train", 1), ("push", 2)]


def test_else_do_nothing_is_no_branch() -> None:
    request = parse_request("Forecast spend, and if projected overspend is over 15% throttle "
                            "bids through the bidder API, else do nothing.")
    assert [(t.verb, t.condition is not None) for t in request.tasks] == [
        ("forecast", False), ("throttle", True)]
    assert request.unplaced == []


def test_a_baseline_with_its_value() -> None:
    [_, ship] = parse_request("Evaluate the ranker on NDCG@10, and ship it to Vespa only if it "
                              "beats the current production NDCG@10 of 0.512.").tasks
    assert ship.condition is not None and ship.condition.value == "0.512"


def test_a_scope_phrase_without_a_comma_and_a_limit_for_all_its_steps() -> None:
    tasks = parse_request("For each plant (Monterrey, Pune, Gyor) resample the sensor data "
                          "and fit an Isolation Forest on it; run at most 2 plants at a "
                          "time.").tasks
    assert [(t.verb, t.items, t.max_parallel) for t in tasks] == [
        ("resample", ("Monterrey", "Pune", "Gyor"), 2), ("fit", ("Monterrey", "Pune", "Gyor"), 2)]
    # a list named in parentheses earlier is what "for each type" goes over
    tasks = parse_request("Split the PDFs by type (invoices, receipts, reports), then for each "
                          "type run a Donut extractor.").tasks
    assert tasks[1].items == ("invoices", "receipts", "reports")


def test_counted_folds_in_parallel_fan_out() -> None:
    [task] = parse_request("Train 5 cross-validation folds in parallel, each on 2 A100s.").tasks
    assert len(task.items) == 5 and task.gpu == 2


def test_passive_with_a_hyphenated_participle_and_a_run_time_limit() -> None:
    request = parse_request("The loan applications in gs://risk/apps/ need to be batch-scored "
                            "with the scorecard model. 64Gi of memory should be allocated and "
                            "the job should be killed if it runs longer than 2 hours.")
    [task] = request.tasks
    assert (task.verb, task.memory, task.timeout) == ("score", "64Gi", 7200)


@pytest.mark.parametrize(("text", "verb", "hook"), [
    ("Tear the vLLM server down no matter what happened.", "tear", "exit"),
    ("Whether that succeeds or fails, release the GPU reservation.", "release", "exit"),
])
def test_exit_hooks_at_either_end(text: str, verb: str, hook: str) -> None:
    [task] = parse_request(text).tasks
    assert (task.verb, task.hook) == (verb, hook)


def test_comparison_symbols_and_an_hourly_minute() -> None:
    tasks = parse_request("Hourly at :20 past, score the transactions; if macro-F1 >= 0.88 "
                          "push it to the registry, else notify the team.").tasks
    assert [(t.verb, t.condition.op if t.condition else "") for t in tasks] == [
        ("score", ""), ("push", ">="), ("notify", ">=")]
    assert parse_request("Hourly at :20 past, score the transactions.").schedule == \
        "20 * * * *"


def test_a_gerund_names_the_action_and_once_clauses_order_it() -> None:
    tasks = parse_request("every 15 min -> pull the sensor batch from MQTT -> isolation "
                          "forest scoring -> write anomalies to TimescaleDB").tasks
    assert [(t.verb, t.stage) for t in tasks] == [("pull", 0), ("score", 1), ("write", 2)]
    assert "isolation forest" in tasks[1].obj
    tasks = parse_request("Roll out the model as a canary; once it has looked healthy for an "
                          "hour, promote it to 100%.").tasks
    assert [t.verb for t in tasks] == ["roll", "promote"]


@pytest.mark.parametrize(("text", "cron"), [
    ("Every weekend at 4am, retrain the recommender.", "0 4 * * 0,6"),
    ("Twice a week (Tuesday and Thursday at 05:30): pull the sales.", "30 5 * * 2,4"),
    ("Three times a week, on Monday, Wednesday and Friday at 18:00, rebuild the index.",
     "0 18 * * 1,3,5"),
])
def test_weekends_and_named_days_a_few_times_a_week(text: str, cron: str) -> None:
    assert parse_request(text).schedule == cron


@pytest.mark.parametrize(("phrase", "seconds"), [
    ("an hour and a half", 5400), ("half an hour", 1800), ("two and a half hours", 9000),
])
def test_halves_of_hours_are_timeouts(phrase: str, seconds: int) -> None:
    [task] = parse_request(f"Fine-tune the ranker with a time limit of {phrase}.").tasks
    assert task.timeout == seconds


@pytest.mark.parametrize(("value", "op"), [
    ("0.88 or higher", ">="), ("0.88 or better", ">="), ("0.88 or lower", "<="),
    ("0.88 or less", "<="),
])
def test_a_value_or_higher_includes_the_value(value: str, op: str) -> None:
    tasks = parse_request(f"Evaluate macro F1 on the holdout; if F1 is {value}, deploy the "
                          "model, otherwise notify the team.").tasks
    deploy, notify = tasks[1], tasks[2]
    assert deploy.condition is not None and notify.condition is not None
    assert (deploy.condition.op, deploy.condition.value, deploy.condition.otherwise) == (
        op, "0.88", False)
    assert (notify.condition.op, notify.condition.otherwise) == (op, True)


def test_if_not_after_a_comma_is_the_else_branch() -> None:
    tasks = parse_request("Evaluate HR@10, and if HR@10 beats 0.25 push the embeddings to "
                          "Milvus, if not ping #recsys on Slack.").tasks
    assert [(t.verb, t.condition.otherwise if t.condition else None) for t in tasks] == [
        ("evaluate", None), ("push", False), ("ping", True)]


def test_once_a_stage_is_done_names_no_new_step() -> None:
    tasks = parse_request("Fine-tune LayoutLMv3 on s3://x/ocr/. When training is done, "
                          "evaluate macro F1 on the holdout.").tasks
    assert [(t.verb, t.stage) for t in tasks] == [("fine-tune", 0), ("evaluate", 1)]


def test_a_scope_inside_the_clause_fans_the_step_out() -> None:
    tasks = parse_request("Train a separate LightFM recommender for each market (br, mx, cl) "
                          "on that market's history, then merge the metrics.").tasks
    assert [(t.verb, t.items) for t in tasks] == [("train", ("br", "mx", "cl")), ("merge", ())]
    tasks = parse_request("Cluster the reviews with BERTopic, and after that summarize each of "
                          "the 20 largest topics with an LLM, then compile the summaries.").tasks
    assert [(t.verb, len(t.items)) for t in tasks] == [
        ("cluster", 0), ("summarize", 20), ("compile", 0)]


def test_a_passive_once_clause_is_a_step_before_the_rest() -> None:
    tasks = parse_request("Once the review dump at /mnt/reviews.jsonl has been deduplicated, "
                          "cluster the reviews with BERTopic.").tasks
    assert [(t.verb, t.stage) for t in tasks] == [("deduplicate", 0), ("cluster", 1)]
    assert "/mnt/reviews.jsonl" in tasks[0].obj
    tasks = parse_request("Train a forest and an SVM. When they have all finished, compare "
                          "their accuracy.").tasks
    assert [(t.verb, t.stage) for t in tasks] == [("train", 0), ("train", 0), ("compare", 1)]


def test_a_trailing_at_the_same_time_runs_the_step_beside_the_one_before() -> None:
    tasks = parse_request("Score the rows. If the anomaly score exceeds 3.5, notify #ops on "
                          "Slack and email ops@example.com at the same time.").tasks
    assert [(t.verb, t.stage) for t in tasks] == [("score", 0), ("notify", 1), ("email", 1)]
    assert all(t.condition is not None for t in tasks[1:])
    tasks = parse_request("Score the rows, then notify #ops on Slack and email ops@x.com.").tasks
    assert [(t.verb, t.stage) for t in tasks] == [("score", 0), ("notify", 1), ("email", 2)]


@pytest.mark.parametrize(("text", "timeout"), [
    ("Train a U-Net on the scans and kill the job if it's still running after 3 hours.", 10800),
    ("Fine-tune T5 on the summaries with a 7 hour ceiling.", 25200),
    ("Fit the reconciliation model; allow up to 1.5 hours.", 5400),
    ("Classify the filings with FinBERT. Cap the FinBERT step at 40 minutes.", 2400),
])
def test_more_ways_to_say_a_timeout(text: str, timeout: int) -> None:
    assert parse_request(text).tasks[0].timeout == timeout


@pytest.mark.parametrize(("text", "retries"), [
    ("Fetch the index pages, retrying failed fetches up to 6 times.", 6),
    ("Copy the table into Redshift and retry the copy as many as 3 times.", 3),
    ("Score every shard and retry each shard up to twice.", 2),
])
def test_more_ways_to_say_retries(text: str, retries: int) -> None:
    assert max(t.retries for t in parse_request(text).tasks) == retries


def test_a_per_heading_with_a_dashed_list_fans_out() -> None:
    [task, merge] = parse_request("Per region: north, south, east - train a Prophet model on "
                                  "that region's sales, then merge the forecasts.").tasks
    assert task.items == ("north", "south", "east") and not merge.items


def test_a_list_named_in_a_heading_is_the_scope_of_for_each() -> None:
    [run, publish] = parse_request(
        "Build banners per store (S1, S2, S3, S4): for each store run the ranker, limiting "
        "it to 2 stores concurrently, and then publish the banners.").tasks
    assert run.items == ("S1", "S2", "S3", "S4") and run.max_parallel == 2
    assert not publish.items


def test_one_model_per_listed_group_is_a_fan_out_and_a_day_night_clock_a_schedule() -> None:
    parsed = parse_request("Saturday nights at 23:30 we refit: one ARIMA model per warehouse "
                           "(w1, w2, w3), no more than two at once, then email the planners.")
    assert parsed.schedule == "30 23 * * 6"
    assert parsed.tasks[0].verb == "train" and parsed.tasks[0].items == ("w1", "w2", "w3")
    assert parsed.tasks[0].max_parallel == 2


def test_a_plural_subject_before_its_auxiliary_is_not_a_verb() -> None:
    # "forecasts are to be saved": the verb is save, not forecast
    [save] = parse_request("The reconciled forecasts are to be saved under s3://f/r/.").tasks
    assert save.verb == "save"


def test_a_request_opening_with_a_name_and_its_data_trains_it() -> None:
    [train, write] = parse_request("bert4rec on the purchase histories, 2 gpus, 32Gi mem, then "
                                   "write the picks to Redis").tasks
    assert (train.verb, train.gpu, train.memory) == ("train", 2, "32Gi")
    assert "bert4rec" in train.text and write.stage > train.stage


def test_a_list_after_through_fans_out_one_job_each() -> None:
    [run, _] = parse_request("Run the checkpoint through ARC, HellaSwag and MMLU, each "
                             "benchmark as its own job, then collect the scores.").tasks
    assert run.items == ("ARC", "HellaSwag", "MMLU")


def test_in_the_meantime_after_modifiers_starts_parallel_work() -> None:
    [a, b, c] = parse_request("Train the acoustic model with 2 GPUs and a 4 hour ceiling, and "
                              "in the meantime build a KenLM model from the corpus. Then "
                              "decode the test set.").tasks
    assert a.stage == b.stage < c.stage and a.timeout == 14400

"""Experiment tracking from the supervisor: MLflow and TensorBoard (the spec's `tracking` section).

listener.py     the RunListener that tees a run's reports into the sinks; `tracked(...)`
background.py   one sink's bounded queue, batching, retry with backoff, drops as events
records.py      what is logged: step metrics (REST names), run tags, the run's end; spec -> params
mlflow_sink.py  one MLflow run per job (log_batch); run_file.py keeps its id in the job directory
tensorboard_sink.py  event files under <job dir>/tensorboard/
"""

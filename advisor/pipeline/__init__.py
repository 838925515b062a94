"""The steps of a run below the orchestrator (:mod:`advisor.analyze`), one job per module.

* :mod:`~advisor.pipeline.plan`: the profile's claimed units grouped into shards by input size;
* :mod:`~advisor.pipeline.map`: one shard's units -> a :class:`~advisor.pipeline.map.ShardResult` of values;
* :mod:`~advisor.pipeline.schedule`: where the maps run (in-process, a process pool, a Dask cluster:
  the only module that opens an executor, :mod:`~advisor.pipeline.executors`), results in shard order;
* :mod:`~advisor.pipeline.reduce`: the results -> summary tables -> cluster rules -> merged findings;
* :mod:`~advisor.pipeline.report`: the :class:`~advisor.model.Report` of a reduced analysis.

Nothing here imports :mod:`advisor.analyze`; each module imports only those before it in this list.
"""

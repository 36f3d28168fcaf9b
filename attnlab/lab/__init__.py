"""What the walkthrough (notebooks/attention_lab.ipynb) calls: run a params grid's gate and sweep, load a run, and
every table, figure and computed answer its sections show. The notebook holds prose and calls `lab.X`; each name
lives in one module of this package, which imports the ones below it only:

    run             the run's lifecycle: params, begin, load, gate, sweep_run, correctness
    notebook        the first cell's setup: offline figures, wide tables, which environment runs the kernel
    page            how a table sits on the page: folded into <details>, its per-row notes said once beneath it
    source          where the speed and memory lessons come from (lessons, Lessons, source_note, rows_line), and the
                    formatters every section shares (readable_bytes, relative_path)
    sections        sections 1, 2 and 5 to 8 and 10: device, hypothesis, speedup, batch policy, head dim, memory
                    (its figure and its folded tables), attribution, ablations, overlap, roofline, the benchmark's
                    lies
    profiler_view   section 9: the profiler view
    explain         the ideas the numbers rest on, drawn from the lesson rows: the memory hierarchy, the fused
                    kernel's tile loop, the online softmax, CUDA-graph replay, the L2 flush and percentiles
    seeds           what the seeds ask to see: grouped-query attention, warm against cold, ragged N in the gate
    answers         sections 11 and 12: check yourself and the experiment record

The order a notebook calls the run's steps in is in attnlab.lab.run.

Where the speed and memory lessons come from (`lessons(run)`): this run's own rows when it ran on a CUDA GPU and
measured our three builds; otherwise the newest committed GPU run (`reference_run`: the newest outputs/<gpu>/<run>/
whose provenance names a CUDA device and whose results hold materialised, qk_softmax and fused), and every section
says so. On a CPU our kernels run in Triton's interpreter, whose timings measure Python; they are never shown as
speed. What is true on a CPU is run there: the gate, the ablations against their own oracles, the byte and memory
model, the method. ATTNLAB_OUTPUTS (an environment variable) points reference_run at another outputs folder.
"""
from attnlab.lab.run import (GATE, GATE_SKIPS, KEYS, OURS, PARAMS, WARM_JOBS, GateFailed, Run, begin, correctness,
                             gate, gate_builds, gate_failures, gate_in_processes, load, new_folder, params,
                             run_shapes, sweep_run)
from attnlab.lab.notebook import RENDERER, offline_renderer, setup
from attnlab.lab.page import Folded, Noted, fold, fold_all, noted
from attnlab.lab.source import (Lessons, gpu_rows, groups_of, has_ours, lessons, needs_lessons, no_lessons,
                                readable, readable_bytes, relative_path, rows_line, source_note)
from attnlab.lab.sections import (HOPPER_FLOPS_PER_EXP, LIES, SMALL_SHARE, ablation_figure, ablations, attribution,
                                  attribution_figure, batch_policy, batch_policy_figures, batch_policy_note,
                                  byte_model, curve_words, dominant, head_dim_facts, head_dim_note, head_dim_words,
                                  hypothesis, lie, lie_outputs, memory, memory_details, memory_figure, overlap,
                                  overlap_findings, policy_of, policy_runs, pv_by_head_dim, roofline_figures,
                                  roofline_table, speedup_figures, speedup_table, summary, trend)
from attnlab.lab.profiler_view import fused_stages_refused, profile, profile_report, profile_shape
from attnlab.lab.explain import (graph_replay, memory_hierarchy, online_softmax, online_steps, teaching_row,
                                 tile_loop, timing_spread)
from attnlab.lab.seeds import bench_pairs, gqa, gqa_pairs, ragged, ragged_table, warm_cold, warm_cold_table
from attnlab.lab.answers import (Question, check_yourself, experiment_record, predict_accuracy, predict_bound,
                                 predict_boundaries, predict_head_dim, predict_peaks, predict_times, questions,
                                 record)
from attnlab.runs import reference_run

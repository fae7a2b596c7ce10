"""Chunk-wise distillation of MELT from its Ouro teacher (train: Phase 1 and Phase 2, one loop of
both), the run's config and resumable state (train_config, trainer_state), the teacher's logits
kept between steps (teacher_cache), the embedded default's teacher pretraining (pretrain), and the
submitit launch onto SLURM (launch).

May import: modeling, generation, and the leaves data and tracking.
"""

// The JSON the viewer reads, as the API's schemas write it (services/api/conductor_api/
// schemas.py, stats.py; src/conductor/workflow.py). Times are ISO 8601 strings.

export type WorkflowStatus = 'queued' | 'running' | 'completed' | 'failed' | 'cancelled';
export type StepStatus = 'pending' | 'running' | 'succeeded' | 'failed' | 'cancelled';

/** Token counts. Workflows carry total_tokens; a step's or a call's usage does not. */
export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens?: number;
  cached_tokens?: number;
  reasoning_tokens?: number;
}

export interface Attempt {
  number: number;
  worker: string | null;
  status: 'ok' | 'error';
  error_class: string | null;
  error: string | null;
  status_code: number | null;
  usage: Usage;
  cost_usd: number;
  latency_ms: number;
  quota_wait_ms: number;
  started_at: string;
}

export interface Step {
  index: number;
  round: number;
  kind: 'worker' | 'conductor';
  worker: string;
  subtask: string;
  access_list: (number | 'all')[];
  visible_steps: number[];
  status: StepStatus;
  output: string | null;
  usage: Usage;
  cost_usd: number;
  latency_ms: number;
  started_at: string | null;
  finished_at: string | null;
  error: string | null;
  attempts: Attempt[];
}

export interface PlannerCall {
  round: number;
  raw_output: string;
  valid: boolean;
  errors: string[];
  usage: Usage;
  cost_usd: number;
  latency_ms: number;
  backend: string;
}

interface WorkflowCommon {
  id: string;
  status: WorkflowStatus;
  variant: string;
  question: string;
  metadata: Record<string, string>;
  error: string | null;
  usage: Usage;
  cost_usd: number;
  latency_ms: number;
  created_at: string;
  finished_at: string | null;
}

export interface WorkflowSummary extends WorkflowCommon {
  step_count: number;
}

export interface Workflow extends WorkflowCommon {
  plan_valid: boolean;
  planner_calls: PlannerCall[];
  steps: Step[];
  answer: string | null;
  feedback: number | null;
}

export interface WorkflowList {
  data: WorkflowSummary[];
  first_id: string | null;
  last_id: string | null;
  has_more: boolean;
}

export interface ModelCard {
  id: string;
  kind: 'variant' | 'worker';
}

export interface Stats {
  bucket: 'hour' | 'day';
  created_after?: string;
  created_before?: string;
  totals: {
    workflows: number;
    completed: number;
    failed: number;
    cancelled: number;
    running: number;
    queued: number;
    tokens: number;
    cost_usd: number;
    valid_plan_rate: number | null;
    latency_ms_p50: number | null;
    latency_ms_p95: number | null;
  };
  by_variant: { start: string; variant: string; workflows: number; tokens: number; cost_usd: number }[];
  by_worker: { start: string; worker: string; steps: number; tokens: number; cost_usd: number }[];
  failure_reasons: { reason: string; count: number }[];
}

export const TERMINAL: ReadonlySet<WorkflowStatus> = new Set(['completed', 'failed', 'cancelled']);

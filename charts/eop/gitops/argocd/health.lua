-- Argo CD health check for exactlyonce.io/ExactlyOncePipeline.
-- Install it as resource.customizations.health.exactlyonce.io_ExactlyOncePipeline in argocd-cm
-- (docs/gitops.md). It reads what eop writes: status.phase, the conditions and
-- observedGeneration.
--   Healthy      phase Running and condition Ready True
--   Suspended    phase Suspended and the driver stopped (Progressing False)
--   Degraded     phase Degraded or Invalid, or condition Degraded True (also mid-upgrade)
--   Progressing  everything else: no status yet, a spec the operator has not seen,
--                Pending (new, starting, restarted), Upgrading, suspending, deleting
local hs = { status = "Progressing", message = "waiting for the operator to report a status" }

local function describe(condition, fallback)
  if condition ~= nil and condition.message ~= nil and condition.message ~= "" then
    if condition.reason ~= nil and condition.reason ~= "" then
      return condition.reason .. ": " .. condition.message
    end
    return condition.message
  end
  return fallback
end

if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  hs.message = "being deleted"
  return hs
end
local status = obj.status
if status == nil or status.phase == nil then
  return hs
end

local conditions = {}
if status.conditions ~= nil then
  for _, condition in ipairs(status.conditions) do
    conditions[condition.type] = condition
  end
end
local function is_true(kind)
  return conditions[kind] ~= nil and conditions[kind].status == "True"
end

local phase = status.phase
local generation = obj.metadata ~= nil and obj.metadata.generation or nil
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.message = "the operator has not acted on generation " .. string.format("%d", generation) .. " yet"
  return hs
end

if phase == "Degraded" or phase == "Invalid" or is_true("Degraded") then
  hs.status = "Degraded"
  hs.message = describe(conditions["Degraded"], "phase " .. phase)
elseif phase == "Suspended" and not is_true("Progressing") then
  hs.status = "Suspended"
  hs.message = describe(conditions["Ready"], "suspended")
elseif phase == "Running" and is_true("Ready") then
  hs.status = "Healthy"
  hs.message = describe(conditions["Ready"], "running")
else
  hs.message = describe(conditions["Progressing"], "phase " .. phase)
end
return hs

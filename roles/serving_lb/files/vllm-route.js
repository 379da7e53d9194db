// Route an OpenAI-style request to the upstream of the model named in its JSON body (njs, nginx >= 1.22).
//
// nginx has read the whole body (client_body_buffer_size == client_max_body_size) before js_content runs.
// The model -> named-location table is the `map $vllm_lb_model $vllm_lb_location` in the rendered config, so this
// script is the same on every balancer. Managed by provisioner (roles/serving_lb).

function notFound(r, model) {
    r.headersOut['Content-Type'] = 'application/json';
    r.return(404, JSON.stringify({
        error: {
            message: 'The model `' + model + '` does not exist.',
            type: 'NotFoundError',
            param: 'model',
            code: 404,
        },
    }) + '\n');
}

function route(r) {
    var model;
    var text = r.requestText;
    if (text) {
        try {
            var body = JSON.parse(text);
            if (body && typeof body.model === 'string') {
                model = body.model;
            }
        } catch (e) {
            model = undefined; // not JSON (e.g. multipart): the default model's upstream answers
        }
    }
    if (model === undefined) {
        r.internalRedirect(r.variables.vllm_lb_default_location);
        return;
    }
    r.variables.vllm_lb_model = model;
    var location = r.variables.vllm_lb_location;
    if (!location) {
        notFound(r, model);
        return;
    }
    r.internalRedirect(location);
}

export default { route };
